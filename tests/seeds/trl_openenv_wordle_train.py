"""The guide's Wordle training block, as it runs here. Above the marker, what it uses that the guide
defines in the block before (the WordleEnv class: trl_openenv_wordle_env.py beside this file)."""

from trl_openenv_wordle_env import WordleEnv

# -- the guide's block --
from datasets import Dataset
from harbor_rl import GRPOConfig, GRPOTrainer

def reward_win(environments, **kwargs) -> list[float]:
    return [1.0 + 0.5 * (1 - env.num_guesses / 6) if env.won else 0.0 for env in environments]

def reward_partial(environments, **kwargs) -> list[float]:
    return [0.0 if env.won else 0.1 * env.best_greens for env in environments]

def reward_invalid(environments, **kwargs) -> list[float]:
    return [-0.1 * env.invalid_moves for env in environments]

prompt = """You are an expert Wordle solver with deep knowledge of English vocabulary...
Use the tool `guess` to make a guess."""

dataset = Dataset.from_dict({"prompt": [[{"role": "user", "content": prompt}]] * 2})

trainer = GRPOTrainer(
    model="tiny",
    reward_funcs=[reward_win, reward_partial, reward_invalid],
    train_dataset=dataset,
    args=GRPOConfig(
        chat_template_kwargs={"enable_thinking": True},
        max_completion_length=96,
        max_tool_calling_iterations=12,
        vllm_importance_sampling_mode="token_truncate",
        num_generations=2,
        per_device_train_batch_size=2,
        gradient_accumulation_steps=1,
        learning_rate=1e-6,
        lr_scheduler_type="constant",
        max_steps=1,
    ),
    environment_factory=WordleEnv,
)
trainer.train()
