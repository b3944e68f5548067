"""Step progress: `ProgressPayload` outputs for streams, and a tqdm bar for offline use.

The runner reports one event per request per denoising step. The engine turns the events
of live requests into `StageOutput(finished=False)`; the bar (when enabled) counts
denoising steps over all requests, live as the runner reports them, and closes when the
engine goes idle.
"""

from __future__ import annotations

from omnistage.core.types import ProgressPayload


class ProgressBar:
    def __init__(self, enabled: bool = False, desc: str = "denoising"):
        self.enabled = enabled
        self.desc = desc
        self._bar = None
        self._steps: dict[str, int] = {}  # request id -> steps counted so far

    def update(self, events: list[tuple[str, ProgressPayload]]) -> None:
        if not self.enabled or not events:
            return
        if self._bar is None:
            from tqdm.auto import tqdm

            self._bar = tqdm(total=0, desc=self.desc, unit="step", dynamic_ncols=True)
        advanced = 0
        for rid, progress in events:
            if rid not in self._steps:
                self._bar.total += progress.num_steps
                self._steps[rid] = 0
            advanced += progress.step - self._steps[rid]
            self._steps[rid] = progress.step
        self._bar.set_postfix(requests=len(self._steps), refresh=False)
        self._bar.update(advanced)

    def close(self) -> None:
        if self._bar is not None:
            self._bar.close()
        self._bar = None
        self._steps.clear()
