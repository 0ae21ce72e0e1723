import anyio
import anyio.lowlevel
import pytest

from sandgym.core.clients import OpenAIClient
from sandgym.core.parsers import XMLParser
from sandgym.core.rubric import GraderRubric, Rubric
from sandgym.core.state import State
from sandgym.core.testing import MockOpenAIServer, Reply

pytestmark = pytest.mark.anyio


def make_state(text: str, answer: str = "4", idx: int = 0) -> State:
    return State(
        prompt=[{"role": "user", "content": "2+2?"}],
        completion=[{"role": "assistant", "content": text}],
        answer=answer,
        info={"k": "v"},
        rollout_index=idx,
    )


async def test_reward_functions_get_only_the_arguments_they_name_sync_and_async() -> None:
    seen: dict[str, set[str]] = {}
    parser = XMLParser(["answer"])

    def exact(completion, answer, parser):  # sync, named args only
        seen["exact"] = {"completion", "answer", "parser"}
        return 1.0 if parser.parse_answer(completion) == answer else 0.0

    async def uses_info(info, state):  # async
        await anyio.lowlevel.checkpoint()
        seen["uses_info"] = set()
        assert state.info is info
        return 0.5 if info.get("k") == "v" else 0.0

    def length(completion):
        return float(len(completion[-1]["content"]))

    def takes_kwargs(**kw):
        seen["takes_kwargs"] = set(kw)
        return 0.0

    rubric = Rubric([exact, uses_info], [1.0, 2.0], parser=parser)
    rubric.add_metric(length)
    rubric.add_reward_func(takes_kwargs, 0.0)
    s = await rubric.score_rollout(make_state("<answer>4</answer>"), {"sandbox": "SB"})
    assert s.reward == pytest.approx(1.0 + 2 * 0.5)
    assert s.metrics["exact"] == 1.0 and s.metrics["uses_info"] == 0.5
    assert s.metrics["length"] == len("<answer>4</answer>")
    # **kwargs gets everything, including the environment's extras
    assert {"prompt", "completion", "answer", "state", "info", "task", "parser", "sandbox"} <= seen["takes_kwargs"]


async def test_failing_reward_function_scores_zero_and_marks_the_rollout() -> None:
    def boom(completion):
        raise RuntimeError("nope")

    s = await Rubric([boom]).score_rollout(make_state("x"))
    assert s.reward == 0.0 and s.metrics["boom_error"] == 1.0
    assert s.error is not None and "boom" in s.error and "nope" in s.error


async def test_group_rewards_and_advantages() -> None:
    def correct(completion, answer):
        return 1.0 if answer in completion[-1]["content"] else 0.0

    def shortest_bonus(completions):  # group function: one value per rollout
        lens = [len(c[-1]["content"]) for c in completions]
        return [1.0 if n == min(lens) else 0.0 for n in lens]

    rubric = Rubric([correct])
    rubric.add_group_reward_func(shortest_bonus, 0.5)
    states = [make_state(t, idx=i) for i, t in enumerate(["4", "it is 4", "5", "no idea at all"])]
    for s in states:
        await rubric.score_rollout(s)
    await rubric.score_group(states)
    assert [s.reward for s in states] == [1.5, 1.0, 0.5, 0.0]
    adv = [s.advantage for s in states]
    assert sum(adv) == pytest.approx(0.0, abs=1e-9)
    assert adv[0] > adv[1] > adv[2] > adv[3]
    # normalised by the group std
    mean = sum(s.reward for s in states) / 4
    std = (sum((s.reward - mean) ** 2 for s in states) / 4) ** 0.5
    assert adv[0] == pytest.approx((1.5 - mean) / std, rel=1e-4)


async def test_grader_rubric_asks_the_model() -> None:
    def responder(body):
        content = body["messages"][-1]["content"]
        return Reply(content="yes" if "Response:\n```\n4\n```" in content else "no")

    with MockOpenAIServer(responder) as srv:
        client = OpenAIClient(srv.base_url, max_retries=0)
        rubric = GraderRubric(client, "grader")
        good = await rubric.score_rollout(make_state("4"))
        bad = await rubric.score_rollout(make_state("5"))
        await client.aclose()
    assert good.reward == 1.0 and bad.reward == 0.0
    assert "Ground truth answer" in srv.requests[0]["messages"][0]["content"]
