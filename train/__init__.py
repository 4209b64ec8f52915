"""GRPO training on TRL + Accelerate + DeepSpeed; installed as ``rllm_gym.train``."""
