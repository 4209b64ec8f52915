"""The environments, one module each; installed as ``rllm_gym.envs`` and registered in ``rllm_gym.registry``."""
