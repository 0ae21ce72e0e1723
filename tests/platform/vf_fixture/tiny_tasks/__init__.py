"""A one-task verifiers 0.4.0 taskset for the end-to-end test of its `prime` runtime against
`sandgym serve` (tests/platform/test_verifiers.py). Loaded by `vf-eval tiny_tasks` with this
directory on PYTHONPATH, in verifiers' own venv -- never imported by the test suite itself."""

import verifiers.v1 as vf


class TinyData(vf.TaskData):
    """One row: a prompt."""


class TinyTask(vf.Task[TinyData]):
    @vf.reward(weight=1.0)
    async def answered(self, trace: vf.Trace) -> float:
        # The harness ran in the sandbox and reached the model through the interception
        # server on the host: at least one model call was recorded.
        return 1.0 if trace.calls else 0.0


class TinyConfig(vf.TasksetConfig):
    num_tasks: int = 1


class TinyTaskset(vf.Taskset[TinyTask, TinyConfig]):
    def load(self) -> list[TinyTask]:
        return [TinyTask(TinyData(prompt="Say hello."), self.config.task) for _ in range(self.config.num_tasks)]


__all__ = ["TinyTaskset"]
