"""Rollout workers: take rollouts from the store, run an agent on each, record rewards, keep attempts alive."""

from spanlab.runner.agent import Agent, RolloutContext, Scored, load_agent
from spanlab.runner.worker import Worker

__all__ = ["Agent", "RolloutContext", "Scored", "Worker", "load_agent"]
