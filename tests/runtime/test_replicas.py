"""Stage replicas (`num_replicas`): each copy is its own supervised stage process, requests
are routed by `routing_policy`, and a copy killed under load loses no request that had sent
no output (it is re-run on the other copy) while the stage stays healthy."""

from __future__ import annotations

import functools
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from types import SimpleNamespace

import pytest
from engine.fake_engines import Collector, FakeEngine, streamed_tts
from fastapi.testclient import TestClient
from prometheus_client import generate_latest

from omnistage.config import PipelineSpec, StageDeployConfig, StageSpec
from omnistage.diffusion.params import DiffusionParams
from omnistage.core.errors import ErrorKind
from omnistage.core.types import StageRequest
from omnistage.engine.orchestrator import OmniRequest, Orchestrator
from omnistage.engine.replicas import ReplicaSet, count_states
from omnistage.engine.routing import Affinity, LeastOutstanding, RoundRobin
from omnistage.engine.stage_handle import DeviceLists
from omnistage.entrypoints.omni import AsyncOmni
from omnistage.entrypoints.openai.api_server import ServerSettings, create_app
from omnistage.testing.zoo import call_kwargs

DRAW = PipelineSpec("draw", (StageSpec(0, "drawer", "diffusion", "image", final_output=True),))
TALK = PipelineSpec("talk", (StageSpec(0, "talker", "ar", "text", final_output=True),))


def replicated(policy: str, **fields) -> dict[int, StageDeployConfig]:
    return {0: StageDeployConfig(runtime="process", num_replicas=2, routing_policy=policy,
                                 max_restarts=3, restart_backoff_s=0.3, **fields)}


def start(spec, configs, **engine) -> Orchestrator:
    orch = Orchestrator(spec, "m", configs, engine_factory=functools.partial(FakeEngine, **engine))
    orch.start()
    return orch


def wait_until(predicate, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert time.monotonic() < deadline, "timed out"
        time.sleep(0.01)


def run_all(orch: Orchestrator, requests: list[OmniRequest]) -> dict[str, object]:
    got = Collector()
    for request in requests:
        orch.submit(request, got.sink(request.request_id))
    return {r.request_id: got.wait(r.request_id) for r in requests}


def drawn_by(out) -> int:
    assert out.error is None and out.images, out.error
    return out.images[0].info["pid"]


# -- the policies, on their own ----------------------------------------------------------


class Holding:
    """A stand-in supervisor holding `n` requests asking `steps` each (all a policy reads of one)."""

    def __init__(self, n: int, steps: int | None = None):
        params = None if steps is None else DiffusionParams(num_inference_steps=steps)
        self.held = {f"r{i}": SimpleNamespace(request=StageRequest(f"r{i}", "x", params)) for i in range(n)}


def test_least_outstanding_picks_the_replica_holding_least_and_round_robin_ignores_load():
    busy, idle = Holding(3), Holding(1)
    serving = [(0, busy), (1, idle)]
    request = StageRequest("x", "a cat")
    policy = LeastOutstanding()
    assert [policy.pick(serving, request) for _ in range(4)] == [1, 1, 1, 1]
    rr = RoundRobin()
    assert [rr.pick(serving, request) for _ in range(4)] == [0, 1, 0, 1]


def test_least_outstanding_weighs_requests_by_the_steps_they_ask_for():
    one_long, three_short = Holding(1, steps=50), Holding(3, steps=4)
    serving = [(0, one_long), (1, three_short)]
    policy = LeastOutstanding()
    assert policy.outstanding(one_long) == 50 and policy.outstanding(three_short) == 12
    assert [policy.pick(serving, StageRequest(f"x{i}", "a cat", DiffusionParams(num_inference_steps=8)))
            for i in range(2)] == [1, 1]
    # A request that names no steps counts as the mean of those that did (here (8 + 8) / 2).
    assert policy.outstanding(Holding(2)) == 16


def test_affinity_keeps_a_session_and_a_prompt_prefix_on_one_replica_and_moves_only_a_dead_ones_keys():
    policy = Affinity()
    three = [(0, Holding(0)), (1, Holding(9)), (2, Holding(0))]
    picks = {s: policy.pick(three, StageRequest(f"{s}-1", "hi", session_id=s)) for s in "abcdefgh"}
    assert len(set(picks.values())) == 3  # keys spread over the replicas...
    for s, replica in picks.items():  # ...load does not move them, another prompt in the session does not
        assert policy.pick(three, StageRequest(f"{s}-2", "other words", session_id=s)) == replica
    # No session: the prompt's prefix is the key (a later turn starts with the earlier ones).
    turn1 = [{"role": "system", "content": "be brief " * 40}, {"role": "user", "content": "hi"}]
    turn2 = turn1 + [{"role": "assistant", "content": "hello"}, {"role": "user", "content": "more"}]
    assert policy.pick(three, StageRequest("t1", turn1)) == policy.pick(three, StageRequest("t2", turn2))
    # A replica that stops serving hands over only its own sessions.
    survivors = [pair for pair in three if pair[0] != 1]
    for s, replica in picks.items():
        moved = policy.pick(survivors, StageRequest(f"{s}-3", "x", session_id=s))
        assert moved == replica or replica == 1


def test_num_replicas_and_routing_policy_are_checked_naming_the_field():
    with pytest.raises(ValueError, match="num_replicas: must be >= 1, got 0"):
        StageDeployConfig(runtime="process", num_replicas=0)
    with pytest.raises(ValueError, match="num_replicas=2 needs runtime 'process' or 'ray'"):
        StageDeployConfig(num_replicas=2)
    with pytest.raises(ValueError, match="routing_policy: 'random' is not one of"):
        StageDeployConfig(routing_policy="random")


# -- two stage processes -----------------------------------------------------------------


@pytest.fixture(scope="module")
def least_outstanding():
    # Requests of ~0.5 s: a loaded machine must not finish the victim's requests before its kill lands.
    orch = start(DRAW, replicated("least_outstanding"), num_steps=10, step_delay=0.05)
    yield orch
    orch.close()


@pytest.fixture(scope="module")
def affinity():
    orch = start(DRAW, replicated("affinity"), num_steps=2)
    yield orch
    orch.close()


def test_each_replica_is_its_own_process_and_a_burst_is_spread_over_them(least_outstanding):
    handle = least_outstanding.handles[0]
    assert isinstance(handle, ReplicaSet) and isinstance(handle.policy, LeastOutstanding)
    pids = {replica.endpoint.pid for replica in handle.replicas}
    assert len(pids) == 2 and os.getpid() not in pids
    outs = run_all(least_outstanding, [OmniRequest(f"b{i}", f"cat {i}") for i in range(6)])
    served = [drawn_by(out) for out in outs.values()]
    assert {pid: served.count(pid) for pid in pids} == dict.fromkeys(pids, 3)


def test_each_copy_runs_on_its_own_replica_devices_list():
    lists = (("cuda:0",), ("cuda:1",))
    orch = start(DRAW, replicated("round_robin", replica_devices=lists), num_steps=1)
    try:
        outs = run_all(orch, [OmniRequest(f"d{i}", f"cat {i}") for i in range(4)])
        # What each copy's engine got in its process, by the copy that drew the image.
        seen = {drawn_by(out): tuple(out.images[0].info["devices"]) for out in outs.values()}
        copies = orch.handles[0].replicas
        assert seen == {copy.endpoint.pid: lists[i] for i, copy in enumerate(copies)}
    finally:
        orch.close()


def test_replica_devices_is_checked_naming_the_field():
    two = [["cuda:0"], ["cuda:1"]]
    with pytest.raises(ValueError, match=r"replica_devices lists 2 device list\(s\), but num_replicas=3 needs one"):
        StageDeployConfig(runtime="process", num_replicas=3, replica_devices=two)
    with pytest.raises(ValueError, match=r"replica_devices lists 2 .*, but max_replicas=4 needs one per copy"):
        StageDeployConfig(runtime="ray", num_replicas=2, max_replicas=4, replica_devices=two)
    with pytest.raises(ValueError, match=r"replica_devices item 1 lists 1 device\(s\) \['cuda:1'\], but num_devices=2"):
        StageDeployConfig(runtime="process", num_replicas=2, num_devices=2, executor="mp",
                          replica_devices=[["cuda:0", "cuda:2"], ["cuda:1"]])
    with pytest.raises(ValueError, match="replica_devices and devices are both set"):
        StageDeployConfig(runtime="process", num_replicas=2, devices=["cuda:0"], replica_devices=two)
    with pytest.raises(ValueError, match="replica_devices needs runtime 'process' or 'ray'"):
        StageDeployConfig(replica_devices=[["cuda:0"]])
    with pytest.raises(ValueError, match=r"this stage has one copy \(num_replicas=1, no max_replicas\)"):
        StageDeployConfig(runtime="process", replica_devices=[["cuda:0"]])
    with pytest.raises(ValueError, match="replica_devices: expected list of list of string"):
        StageDeployConfig(runtime="process", num_replicas=2, replica_devices=["cuda:0", "cuda:1"])
    config = StageDeployConfig(runtime="process", num_replicas=2, replica_devices=two)
    assert config.replica_devices == (("cuda:0",), ("cuda:1",))  # YAML's lists, stored as tuples


def test_a_copy_added_later_takes_the_first_device_list_no_running_copy_holds():
    lists = DeviceLists("drawer", (("cuda:0",), ("cuda:1",), ("cuda:2",)))
    assert [lists.take() for _ in range(3)] == [0, 1, 2]
    with pytest.raises(RuntimeError, match="all 3 replica_devices lists are held by running copies"):
        lists.take()
    lists.give_back(1)  # copy 1 drained
    assert lists.take() == 1  # the next copy runs where it ran


def test_affinity_sends_a_session_and_a_repeated_prompt_to_the_same_replica(affinity):
    sessions = "abcdef"
    outs = run_all(affinity, [OmniRequest(f"{s}{i}", f"turn {i} of {s}", session_id=s)
                              for i in range(3) for s in sessions])
    by_session = {s: {drawn_by(outs[f"{s}{i}"]) for i in range(3)} for s in sessions}
    assert all(len(pids) == 1 for pids in by_session.values()), by_session
    assert len(set().union(*by_session.values())) == 2  # and the sessions use both replicas
    repeated = run_all(affinity, [OmniRequest(f"p{i}", "the same prompt") for i in range(4)])
    assert len({drawn_by(out) for out in repeated.values()}) == 1


def test_a_replica_killed_under_load_loses_no_request_and_health_stays_up(least_outstanding):
    orch, handle = least_outstanding, least_outstanding.handles[0]
    wait_until(lambda: all(r.is_healthy() for r in handle.replicas))
    victim = handle.replicas[0]
    victim_pid, restarts = victim.endpoint.pid, handle.num_restarts
    seen_states, health = [], []
    stop = threading.Event()

    def watch():  # what /health and /metrics would answer, all along
        while not stop.is_set():
            health.append(orch.check_health())
            seen_states.append(count_states(handle))
            time.sleep(0.005)

    watcher = threading.Thread(target=watch)
    watcher.start()
    got = Collector()
    try:
        rids = [f"k{i}" for i in range(10)]
        for rid in rids:
            orch.submit(OmniRequest(rid, f"dog {rid}"), got.sink(rid))
        # Kill it while it holds requests that have begun (progress only: nothing sent yet).
        wait_until(lambda: len(victim.held) >= 3 and any(got.outputs[r] for r in rids))
        os.kill(victim_pid, signal.SIGKILL)
        outs = {rid: got.wait(rid) for rid in rids}
        wait_until(lambda: handle.num_restarts == restarts + 1 and victim.is_healthy())
    finally:
        stop.set()
        watcher.join()
    assert all(drawn_by(out) for out in outs.values())  # every one answered with its image
    assert handle.num_reruns >= 3
    assert all(health), "the stage turned unhealthy while one replica served"
    assert any(states["restarting"] == 1 and states["serving"] == 1 for states in seen_states)
    assert victim.endpoint.pid != victim_pid
    metrics = generate_latest(orch.metrics_registry).decode()
    assert 'omnistage_stage_replicas{pipeline="draw",stage="drawer",state="serving"} 2.0' in metrics
    assert 'omnistage_stage_replica_reruns{pipeline="draw",stage="drawer"}' in metrics
    assert 'omnistage_stage_replica_outstanding{pipeline="draw",replica="1",stage="drawer"} 0.0' in metrics


def test_a_rerun_goes_ahead_of_the_newer_work_queued_on_the_surviving_copy(zoo):
    # The zoo's tiny Z-Image on two copies taking requests in turn, one at a time each: r0, r2, r4 go
    # to one copy, r1, r3, r5 to the other. The first copy is killed while r0 runs (no restart): its
    # three re-run on the survivor, each queued by when the orchestrator made it, so r0 runs right after
    # r1 (already running there) and every request finishes in the order it was made.
    kwargs = dict(call_kwargs("z-image", "tiny"), num_inference_steps=40)
    prompt, extras = kwargs.pop("prompt"), {"max_sequence_length": kwargs.pop("max_sequence_length")}
    params = {0: DiffusionParams(**kwargs, seed=0, extras=extras)}
    omni = AsyncOmni(zoo("z-image"), stage_overrides={"0": {
        "runtime": "process", "num_replicas": 2, "routing_policy": "round_robin", "max_num_seqs": 1,
        "max_restarts": 0}})
    orch, got, finished = omni.orchestrator, Collector(), []
    try:
        handle = orch.handles[0]
        rids = [f"r{i}" for i in range(6)]
        for rid in rids:
            sink = got.sink(rid)
            orch.submit(OmniRequest(rid, f"{prompt} {rid}", params),
                        lambda out, sink=sink, rid=rid: (out.finished and finished.append(rid), sink(out)))
        wait_until(lambda: sum(len(r.held) for r in handle.replicas) == 6)
        victim = next(r for r in handle.replicas if "r0" in r.held)
        assert set(victim.held) == {"r0", "r2", "r4"}
        wait_until(lambda: got.outputs["r0"] and got.outputs["r1"])  # both copies are running their first
        os.kill(victim.endpoint.pid, signal.SIGKILL)
        outs = {rid: got.wait(rid) for rid in rids}
    finally:
        omni.close()
    assert all(out.error is None and out.images for out in outs.values()), [o.error for o in outs.values()]
    assert handle.num_reruns == 3
    assert [rid for rid in finished if rid != "r1"] == ["r0", "r2", "r3", "r4", "r5"], finished


def test_a_request_that_already_streamed_fails_cleanly_when_its_replica_dies():
    orch = start(TALK, replicated("round_robin"), num_tokens=200, step_delay=0.01)
    got = Collector()
    try:
        orch.submit(OmniRequest("talking", "hello"), got.sink("talking"))
        wait_until(lambda: any(o.text_delta for o in got.outputs["talking"]))
        holder = next(r for r in orch.handles[0].replicas if "talking" in r.held)
        os.kill(holder.endpoint.pid, signal.SIGKILL)
        out = got.wait("talking")
        assert out.error_kind is ErrorKind.UNAVAILABLE and "stage process died" in out.error
        assert orch.check_health() and orch.handles[0].num_reruns == 0
    finally:
        orch.close()


def test_through_the_server_a_killed_replica_costs_no_request_and_health_stays_200(tmp_path):
    # Requests of ~1 s: a loaded machine must not finish the victim's requests before the kill lands.
    factory = functools.partial(FakeEngine, num_steps=50, step_delay=0.02)
    engine = AsyncOmni(tmp_path, pipeline=DRAW, engine_factory=factory,
                       stage_overrides={"0": {"runtime": "process", "num_replicas": 2, "restart_backoff_s": 0.3}})
    app = create_app(ServerSettings(served_model_name="fake", model_path=str(tmp_path)), engine,
                     engine.metrics_registry)
    replicas = engine.orchestrator.handles[0].replicas
    with TestClient(app) as http, ThreadPoolExecutor(8) as pool:
        draw = lambda i: http.post("/v1/images/generations", json={"prompt": f"cat {i}", "size": "64x64"})  # noqa: E731
        pending = [pool.submit(draw, i) for i in range(12)]
        wait_until(lambda: len(replicas[1].held) >= 2)
        os.kill(replicas[1].endpoint.pid, signal.SIGKILL)
        statuses = []
        while not all(f.done() for f in pending) or replicas[1].state != "serving":
            statuses.append(http.get("/health").status_code)
            time.sleep(0.01)
        assert [f.result().status_code for f in pending] == [200] * 12
        assert set(statuses) == {200}
        metrics = http.get("/metrics").text
        assert 'omnistage_stage_replicas{pipeline="draw",stage="drawer",state="serving"} 2.0' in metrics
        assert engine.orchestrator.handles[0].num_reruns >= 2


def test_a_crash_of_its_own_is_not_failed_over_and_a_request_that_crashed_two_copies_is_refused_by_all():
    orch = start(DRAW, replicated("least_outstanding"), num_steps=5, step_delay=0.01)
    got = Collector()
    try:
        outs = []
        for attempt in range(3):  # the client retries the same poison request
            wait_until(lambda: any(r.is_healthy() for r in orch.handles[0].replicas))
            orch.submit(OmniRequest(f"boom{attempt}", "crash"), got.sink(f"boom{attempt}"))
            outs.append(got.wait(f"boom{attempt}"))
        # Not re-run on the other copy: it could be the cause (and would take that one down too).
        for out in outs[:2]:
            assert out.error_kind is ErrorKind.UNAVAILABLE and "exit code 3" in out.error, out.error
        assert orch.handles[0].num_reruns == 0
        # Each copy crashed once; their shared table refuses the third try, whichever copy takes it.
        assert outs[2].error_kind is ErrorKind.INVALID_REQUEST and "crashed the stage 2 times" in outs[2].error
        wait_until(orch.check_health)
        assert drawn_by(run_all(orch, [OmniRequest("fine", "a cat")])["fine"])
    finally:
        orch.close()


def test_the_parts_of_one_streamed_input_stay_on_one_replica_whatever_the_policy():
    # Round robin would deal the parts of one stream out to both copies (three streams in step:
    # an odd number, so no stream lines up with the turns by chance), but a decoder's stream
    # state (the codec's cache) lives in one of them.
    configs = {0: StageDeployConfig(), 1: replicated("round_robin")[0]}
    orch = start(streamed_tts(), configs, num_tokens=4)
    try:
        outs = run_all(orch, [OmniRequest(f"s{i}", f"say {i}") for i in range(3)])
        assert all(out.error is None and out.audio is not None for out in outs.values())
        given = orch.handles[1].call("request_ids").result(timeout=10)  # per replica
        parts = {rid: [(i, part) for i, ids in enumerate(given) for part in ids if part.startswith(f"{rid}#")]
                 for rid in outs}
        assert all(len(got) == 4 for got in parts.values()), parts
        assert all(len({i for i, _ in got}) == 1 for got in parts.values()), parts
    finally:
        orch.close()
