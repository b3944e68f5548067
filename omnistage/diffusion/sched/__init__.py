"""Diffusion schedulers: request mode (whole requests) and step mode (join/leave per step)."""

from omnistage.diffusion.sched.output import RunnerOutput, SchedulerOutput
from omnistage.diffusion.sched.request import EngineRequest, RequestStatus
from omnistage.diffusion.sched.request_scheduler import RequestScheduler
from omnistage.diffusion.sched.step_scheduler import StepScheduler

__all__ = ["EngineRequest", "RequestScheduler", "RequestStatus", "RunnerOutput", "SchedulerOutput",
           "StepScheduler"]
