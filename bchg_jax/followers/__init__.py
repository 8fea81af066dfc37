"""Best-response solvers of the follower."""
from bchg_jax.followers.soft_vi import BestResponse, soft_value_iteration

__all__ = ["BestResponse", "soft_value_iteration"]
