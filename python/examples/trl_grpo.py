"""GRPO with TRL on kernelrl's evaluation service: TRL samples and learns, the service compiles, checks and
times every completion and its reward is the service's.

    build/launch serve configs/kernelbench-level1.toml --port 8470 &      # the evaluators (GPUs)
    pip install ./python trl datasets                                      # in the trainer's environment
    python python/examples/trl_grpo.py --model Qwen/Qwen2.5-Coder-1.5B-Instruct --url http://127.0.0.1:8470

The dataset is the service's own task list (GET /v1/tasks): each row's prompt is the task as the user
message (the model's chat template is applied by TRL) and its task_id column tells the reward function
which task a completion answers.
"""
import argparse

from kernelrl import Client, make_trl_reward


def build_rows(client, limit=0):
    """One conversational row per task: {"prompt": [{"role": "user", "content": ...}], "task_id": ...}."""
    rows = [{"prompt": [{"role": "user", "content": t["prompt"]}], "task_id": t["id"]} for t in client.tasks()]
    return rows[:limit] if limit else rows


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--model", required=True, help="a Hugging Face model id or directory")
    ap.add_argument("--url", default=None, help="the service (default $KERNELRL_URL or http://127.0.0.1:8470)")
    ap.add_argument("--tasks", type=int, default=0, help="use the first N tasks (0: all)")
    ap.add_argument("--out", default="runs/trl-grpo")
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--generations", type=int, default=8, help="completions per prompt (the GRPO group)")
    ap.add_argument("--max-completion-length", type=int, default=1024)
    a = ap.parse_args()

    import torch
    from datasets import Dataset
    from trl import GRPOConfig, GRPOTrainer

    client = Client(a.url)
    health = client.health()
    print("service: %d tasks, %d evaluators, action space %s" % (health["tasks"], health["evaluators"],
                                                                  health["action_space"]))
    dataset = Dataset.from_list(build_rows(client, a.tasks))
    config = GRPOConfig(output_dir=a.out, max_steps=a.steps, num_generations=a.generations,
                        per_device_train_batch_size=a.generations, max_completion_length=a.max_completion_length,
                        logging_steps=1, bf16=torch.cuda.is_available())
    trainer = GRPOTrainer(model=a.model, reward_funcs=make_trl_reward(a.url), args=config, train_dataset=dataset)
    trainer.train()


if __name__ == "__main__":
    main()
