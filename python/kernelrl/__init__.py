"""Client and reward functions for kernelrl's evaluation service (`launch serve CONFIG`)."""
from .client import Client, RequestError, ServiceError
from .rewards import compute_score, compute_score_batch, make_trl_reward, record_value

__all__ = ["Client", "RequestError", "ServiceError", "make_trl_reward", "compute_score", "compute_score_batch",
           "record_value"]
__version__ = "0.1.0"
