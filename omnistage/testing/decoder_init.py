"""Random decoder weights whose greedy output varies from token to token.

A decoder built with transformers' default init (std 0.02 everywhere, final norm weight 1) and
a tied LM head repeats one token forever: its layers add little to the residual stream, so the
last hidden state stays close to the input token's embedding, and a tied head scores that same
token highest. Token-parity tests on such a model pass even when the KV cache is wrong (a model
that only looks at the last token gives the same output).

`init_varied_decoder` redraws the weights from the seed so that context decides each token:
- linears get fan-in scaled weights (std 1/sqrt(fan_in)), so every layer (and with it the
  earlier tokens) changes the stream as much as the embedding does; the attention output and MLP
  down projections get `out_gain` times that;
- embeddings get std `embed_std`; biases and the other norms keep their init;
- the final norm weight is drawn around `final_norm_mean` (negative): with a tied head the
  current token's own logit is then pushed down rather than up, which breaks the one-token loop.

The defaults were chosen on the zoo's tiny qwen2-llm over the prompts the AR tests use (32
greedy steps each): longest run of one token 2 (std 0.02 init: 32), at least 17 distinct tokens;
a mean of -0.5 or -1 left some prompts in loops of one token.

The result is still a checkpoint in the real format (only the numbers change), and the same
seed gives the same weights.
"""

from __future__ import annotations

import math

OUT_PROJECTIONS = ("o_proj", "down_proj")


def init_varied_decoder(model, seed: int, *, final_norm: str = "model.norm", out_gain: float = 1.0,
                        embed_std: float = 1.0, final_norm_mean: float = -2.0) -> None:
    """Redraw `model`'s weights in place (see the module docstring). `final_norm` names the
    decoder's last norm (its weight is drawn around `final_norm_mean`); other norms keep theirs."""
    import torch

    modules = dict(model.named_modules())
    if final_norm not in modules:
        raise KeyError(f"{type(model).__name__} has no module {final_norm!r}")
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        done: set[int] = set()  # a tied head shares the embedding's tensor: draw it once
        for name, module in sorted(modules.items()):
            weight = getattr(module, "weight", None)
            if not isinstance(weight, torch.nn.Parameter) or id(weight) in done:
                continue
            done.add(id(weight))
            if name == final_norm:
                weight.normal_(final_norm_mean, 1.0, generator=g)
            elif isinstance(module, torch.nn.Embedding):
                weight.normal_(0.0, embed_std, generator=g)
            elif isinstance(module, torch.nn.Linear):
                gain = out_gain if name.rsplit(".", 1)[-1] in OUT_PROJECTIONS else 1.0
                weight.normal_(0.0, gain / math.sqrt(weight.shape[1]), generator=g)
