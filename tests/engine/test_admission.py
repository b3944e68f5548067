"""The real-time admission's rule and its capacity meter, without a model (admission.py)."""

from __future__ import annotations

import pytest

from omnistage.core.playback import Playback
from omnistage.engine.admission import HEADROOM, LEAD_S, AudioMeter, RealTimeAdmission


def test_the_meter_measures_audio_per_wall_second_over_busy_time_only():
    meter = AudioMeter()
    for i in range(5):  # 0.4 s of audio every 0.1 s: 4x real time
        meter.observe(0.4, 10.0 + 0.1 * i)
    assert meter.rate == pytest.approx(4.0)  # the first piece was made before the span: not counted
    meter.idle()  # no streams for a while: the gap is not capacity, the last rate stands
    meter.observe(0.4, 60.0)
    assert meter.rate == pytest.approx(4.0)
    for i in range(1, 40):  # 2x real time now; the window forgets the old pace
        meter.observe(0.2, 60.0 + 0.1 * i)
    assert meter.rate == pytest.approx(2.0)


def test_a_new_stream_starts_only_while_every_admitted_one_keeps_ahead():
    measured = RealTimeAdmission()
    assert measured.admits(0, 0, 0)  # an idle pipeline takes anyone
    assert not measured.admits(1, 0, 0)  # nothing measured yet, and no lead
    for i in range(5):
        measured.meter.observe(0.5, 0.1 * i)  # 5 audio seconds per second
    assert measured.capacity == pytest.approx(5.0)
    assert measured.admits(1, 0, 0) and measured.admits(4, 0, 0)  # 4 streams, each made at 1.25x real time
    assert not measured.admits(5, 0, 0)  # 5 get 1x each: no room for a sixth
    assert not measured.admits(1, 1, 0)  # the last newcomer has no audio yet: one at a time
    assert not measured.admits(1, 0, 1)  # a stream already behind its listener: nobody new
    fixed = RealTimeAdmission(capacity=2 * (1 + HEADROOM))  # a total: n + 1 streams must fit it
    assert fixed.admits(1, 1, 0) and not fixed.admits(2, 0, 0)


def test_before_any_rate_a_newcomer_starts_only_while_every_admitted_stream_leads_its_listener():
    # A pipeline that makes a whole answer in less than the meter's shortest span never gets a
    # rate; the admitted streams' own leads over their players say it keeps ahead.
    admission = RealTimeAdmission()
    player = Playback()
    player.receive(0.16, now=10.0)  # a first chunk
    assert player.lead(10.0) == pytest.approx(0.16)
    assert not admission.admits(1, 0, 0, player.lead(10.0))  # a lead under LEAD_S
    player.receive(0.64, now=10.02)  # the next came long before the first ran out
    lead = player.lead(10.03)
    assert lead == pytest.approx(0.77) and lead >= LEAD_S
    assert admission.admits(1, 0, 0, lead) and admission.admits(3, 0, 0, lead)
    assert not admission.admits(2, 1, 0, lead)  # still one newcomer at a time
    assert not admission.admits(2, 0, 1, lead)  # nor beside a stream behind its listener
    assert player.lead(11.0) == 0.0 and not admission.admits(1, 0, 0, player.lead(11.0))  # ran out
