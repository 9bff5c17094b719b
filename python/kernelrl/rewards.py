"""Reward functions over the service, in the shapes RL frameworks call them.

TRL (GRPOTrainer, RLOOTrainer): `make_trl_reward(url)` returns `f(prompts, completions, **columns)` that gives
one float per completion; completions may be strings or conversations ([{"role": "assistant", "content": ...}]);
the task of each completion comes from the dataset column `task_column` (default "task_id").

verl: `compute_score(data_source, solution_str, ground_truth, extra_info=None, **kwargs)` (the naive reward
manager's call) and `compute_score_batch(data_sources, solution_strs, ground_truths, extra_infos, **kwargs)` (the
batch manager's), the task from extra_info["task_id"], else ground_truth; the service from $KERNELRL_URL.
verl loads the file by path (custom_reward_function.path = this file): its imports are absolute.

A request the service refuses (an unknown task, a malformed row) scores `failure_value` (TRL: None, which TRL
leaves out of the mean; verl: 0.0); a service that cannot be reached raises kernelrl.ServiceError.
"""
from kernelrl.client import Client  # absolute: verl loads this file by its path

_clients = {}


def _client(url=None):
    key = url or ""
    if key not in _clients:
        _clients[key] = Client(url)
    return _clients[key]


def record_value(record, value="reward", failure_value=0.0):
    """One number from a verdict record: "reward" (the service's [reward] config, as its runs reward),
    "speedup" (the speedup when correct, else 0), "correct" (1 or 0) or "fast_1" (1 when correct and faster).
    An unconfirmed verdict (correct, its speedup above the review threshold or beyond the device bound) is
    correct at a speedup of at most 1 until confirmed. A request the service refused or could not answer
    gives `failure_value`."""
    if record.get("status") == "request_error":
        return failure_value
    ok = record.get("status") in ("ok", "unconfirmed")
    speedup = float(record.get("speedup") or 0.0)
    if record.get("status") == "unconfirmed":
        speedup = min(speedup, 1.0)
    if value == "reward":
        r = record.get("reward")
        return failure_value if r is None else float(r)
    if value == "speedup":
        return speedup if ok else 0.0
    if value == "correct":
        return 1.0 if ok else 0.0
    if value == "fast_1":
        return 1.0 if ok and speedup > 1.0 else 0.0
    raise ValueError("value must be reward, speedup, correct or fast_1, not %r" % (value,))


def _text(completion):
    if isinstance(completion, str):
        return completion
    if isinstance(completion, list):  # a conversation: the assistant's last message
        for m in reversed(completion):
            if isinstance(m, dict) and m.get("role", "assistant") == "assistant":
                return m.get("content") or ""
        return ""
    if isinstance(completion, dict):
        return completion.get("content") or ""
    raise TypeError("a completion is a string or a list of messages, not %s" % type(completion).__name__)


def _prompt_text(prompt):
    """What the record keeps as the prompt: the text, or a conversation's last user message."""
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, list):
        for m in reversed(prompt):
            if isinstance(m, dict) and m.get("role") == "user":
                return m.get("content")
    return None


def make_trl_reward(url=None, task_column="task_id", value="reward", failure_value=None, max_workers=32):
    """A reward function for TRL's GRPOTrainer: every completion of the batch evaluated in parallel."""
    client = _client(url)

    def reward(prompts=None, completions=None, **kwargs):
        if completions is None:
            raise TypeError("the reward function needs completions")
        if task_column not in kwargs:
            raise KeyError("the dataset has no column %r naming each row's task (make_trl_reward(task_column=...))"
                           % task_column)
        tasks = kwargs[task_column]
        if len(tasks) != len(completions):
            raise ValueError("%d tasks for %d completions" % (len(tasks), len(completions)))
        prompt_texts = [None] * len(completions)
        if prompts is not None and len(prompts) == len(completions):
            prompt_texts = [_prompt_text(p) for p in prompts]
        requests = []
        for t, c, p in zip(tasks, completions, prompt_texts):
            r = {"task": t, "action": _text(c)}
            if p is not None:
                r["prompt"] = p
            requests.append(r)
        records = client.evaluate_many(requests, max_workers=max_workers)
        return [record_value(r, value, failure_value) for r in records]

    reward.__name__ = "kernelrl_" + value
    return reward


def _task_of(ground_truth, extra_info):
    if isinstance(extra_info, dict) and extra_info.get("task_id"):
        return extra_info["task_id"]
    if isinstance(ground_truth, dict):
        return ground_truth.get("task_id")
    return ground_truth


def _verl_result(record):
    return {"score": record_value(record, "reward"), "speedup": record_value(record, "speedup"),
            "correct": record_value(record, "correct")}


def compute_score(data_source=None, solution_str=None, ground_truth=None, extra_info=None, **kwargs):
    """verl's custom reward function (NaiveRewardManager): {"score": reward, "speedup", "correct"}."""
    record = _client(kwargs.get("url")).evaluate_many([{"task": _task_of(ground_truth, extra_info),
                                                        "action": solution_str}])[0]
    return _verl_result(record)


def compute_score_batch(data_sources=None, solution_strs=None, ground_truths=None, extra_infos=None, **kwargs):
    """verl's batch reward manager: one result per solution, evaluated in parallel."""
    n = len(solution_strs)
    extra_infos = extra_infos if extra_infos is not None else [None] * n
    ground_truths = ground_truths if ground_truths is not None else [None] * n
    requests = [{"task": _task_of(g, e), "action": s} for s, g, e in zip(solution_strs, ground_truths, extra_infos)]
    return [_verl_result(r) for r in _client(kwargs.get("url")).evaluate_many(requests, max_workers=32)]
