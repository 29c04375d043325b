"""The job an algorithm runs in, and the phases every job shares: base and final evaluation, warm start, report.

:func:`run_job` opens the rig (store, engine, gateway, rollout collector), makes the task splits,
loads the policy when the algorithm trains weights, evaluates the held-out split, runs the optional
warm start, hands the job to ``Algorithm.run`` and evaluates again. A held-out number therefore means
the same for every algorithm: same tasks, same agent/gateway path, same temperature, same metrics.
Ctrl-C anywhere stops the rollouts, closes what was opened (the engine included) and re-raises.

Around that the framework keeps what a run leaves besides spans (:mod:`spanlab.jobs.checkpoints`): a
servable ``final/`` (and ``step-K/``) folder, the state ``--resume`` continues from
(:mod:`spanlab.jobs.resuming`), and the configured experiment trackers (:mod:`spanlab.jobs.tracking`),
fed from ``log_step`` and ``held_out`` only, so they see exactly what ``train_metrics`` holds.
"""

from __future__ import annotations

import logging
import random
import signal
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, field
from functools import cached_property
from types import FrameType
from typing import TYPE_CHECKING, Any

from rich.console import Console

from spanlab.errors import ConfigError
from spanlab.jobs import checkpoints, resuming
from spanlab.jobs.algorithm import Algorithm
from spanlab.jobs.config import TrainConfig
from spanlab.jobs.registry import load_algorithm
from spanlab.jobs.report import Evaluation, TrainReport, metric_means
from spanlab.jobs.rig import Rig, open_rig
from spanlab.jobs.rollouts import RolloutBatch, rollout_metrics
from spanlab.jobs.tasks import TaskSet, load_task_set
from spanlab.jobs.tracking import Trackers, open_trackers
from spanlab.progress import Phase, PhaseProgress, log_console, running_mean

if TYPE_CHECKING:
    import torch

    from spanlab.jobs.parts import Collector, Demonstrations, StepLog, TaskStream
    from spanlab.policies.serving import PolicyAdapters
    from spanlab.training.policy import Policy
    from spanlab.training.resume import TrainState
    from spanlab.training.settings import LoraConfig
    from spanlab.training.trainers import MakeOptimizer, Trainer, TrainStep

logger = logging.getLogger(__name__)

Tasks = list[dict[str, Any]]
Evaluator = Callable[[Tasks, str, str, Phase], RolloutBatch]  # (held-out tasks, phase, split, bar) -> a reward per task


def split_tasks(task_set: TaskSet, config: TrainConfig, n_train: int) -> dict[str, Tasks]:
    """``train`` (generated train tasks), ``demos`` (those of ``warm_start.levels``), ``rl`` (those of
    ``train_levels``), ``eval`` (the headline split, held out by question) and ``eval:<name>`` for each of
    ``eval.extra_splits`` (held out by what the task set says, e.g. phrasing, at the levels each asks)."""
    data, ev, ws = config.dataset, config.eval, config.warm_start
    demo_levels = set(ws.levels or data.levels) if ws else set(data.levels)
    n_demos = ws.demos if ws else 0
    # enough train tasks that the demonstrated levels alone hold the demos (levels interleave round-robin), and the
    # tasks a mined warm start runs (the first ones of the train split)
    n_train = max(n_train, -(-n_demos * len(data.levels) // max(len(demo_levels & set(data.levels)), 1)),
                  ws.mined_tasks if ws else 0, 1)

    def make(split: str, n: int, key: str, levels: tuple[int, ...] | None = None) -> Tasks:
        try:
            return task_set.make_tasks(split, n=n, seed=data.seed, levels=levels or data.levels, **data.kwargs)
        except TypeError as exc:  # an option the task set does not take
            raise ConfigError(f"dataset.kwargs: task set {data.name!r}: {exc}") from exc
        except ValueError as exc:
            raise ConfigError(f"{key}: task set {data.name!r}: {exc}") from exc

    train = make("train", data.train_tasks or n_train * 2, "dataset")
    headline, *extra = ev.split_specs
    splits = {"train": train, "demos": [t for t in train if t.get("level", 0) in demo_levels or "level" not in t],
              "eval": make(headline.split, ev.tasks, "dataset", headline.levels)}
    for spec in extra:
        splits[f"eval:{spec.name}"] = make(spec.split, ev.tasks, "eval.extra_splits", spec.levels)
    rl_levels = set(data.rl_weights)
    return {**splits, "rl": [t for t in train if t.get("level") in rl_levels] or train}


def level_quota(weights: dict[int, float], n: int) -> dict[int, int]:
    """``n`` tasks shared out by weight, largest remainders first, so the counts add up to ``n`` exactly."""
    total = sum(weights.values())
    exact = {lv: n * w / total for lv, w in weights.items()}
    quota = {lv: int(x) for lv, x in exact.items()}
    for lv in sorted(exact, key=lambda lv: (quota[lv] - exact[lv], -lv))[: n - sum(quota.values())]:  # ties: deeper
        quota[lv] += 1
    return quota


@dataclass
class Job:
    """One run's open pieces, given to ``Algorithm.run``: rig, task splits, policy (if trained), report."""

    config: TrainConfig
    rig: Rig
    task_set: TaskSet
    splits: dict[str, Tasks]
    report: TrainReport
    progress: PhaseProgress  # every phase's bar (or plain lines), on the console the log lines use
    stack: ExitStack  # closed when the job ends: an algorithm registers what it opens here
    policy: Policy | None = None
    evaluator: Evaluator | None = None  # how the held-out policy runs; default: the served model
    started: float = field(default_factory=time.monotonic)
    tracker: Trackers = field(default_factory=lambda: Trackers([]))
    saves_state: bool = False  # the algorithm can resume: save the trainer state after each step
    optimizer: torch.optim.Optimizer | None = None
    resume_state: TrainState | None = None  # what --resume loaded (the optimizer's moments wait here)
    planned_steps: int | None = None  # the algorithm's step count (the last step's curve point is the final evaluation)
    policy_adapters: PolicyAdapters | None = None  # with policies: each policy's served adapter (open_policies)
    _steps_bar: Phase | None = None  # the open step loop's bar: a step's collection tells it the update follows

    @property
    def served_name(self) -> str:
        """The model name rollouts must ask for: the latest pushed policy (a LoRA adapter's own name) or the base."""
        return self.policy.sync.served_name if self.policy is not None else self.rig.served

    def collect(self, tasks: Tasks, *, group_size: int = 1, **metadata: Any) -> RolloutBatch:
        """Train rollouts of the served policy at ``rollouts.temperature``, recorded and flushed to the store."""
        temperature = self.config.rollouts.temperature
        overrides = {} if temperature is None else {"temperature": temperature}
        step = metadata.get("step")
        done = resuming.finished_rollouts(self, step) if self.resume_state is not None and step is not None else None
        index = step if step is not None else metadata.get("round")  # SFT rounds are the steps of their loop
        label = "rollouts" if index is None else f"step {index + 1} rollouts"
        with self.progress.phase(label, len(tasks) * group_size, done=len(done or ())) as bar:
            batch = self.rig.collector.collect(tasks, mode="train", group_size=group_size, model=self.served_name,
                                               metadata={"run_id": self.report.run_id, **metadata}, done=done,
                                               on_finished=running_mean(bar, "reward {:.2f}"), **overrides)
        self.rig.gateway.flush()
        if index is not None:
            self.step_note("updating")
        return batch

    def task_draws(self, tasks_per_step: int) -> Iterator[Tasks]:
        """The ``rl`` split's tasks, ``tasks_per_step`` distinct ones per draw, seeded by the dataset seed: step k
        of a sync loop trains on draw k; an async loop queues the draws' tasks one group after another."""
        rng = random.Random(self.config.dataset.seed)
        while True:
            yield self.draw(rng, tasks_per_step)

    def draw(self, rng: random.Random, n: int, exclude: frozenset[str] | set[str] = frozenset()) -> Tasks:
        """``n`` distinct ``rl`` tasks (fewer if the pool is short) not in ``exclude`` (task IDs); weighted
        ``train_levels`` give each level its share (largest remainders)."""
        pool = [t for t in self.splits["rl"] if t.get("task_id") not in exclude]
        by_level: dict[int, Tasks] = {}
        for task in pool:
            by_level.setdefault(task.get("level", 0), []).append(task)
        weights = {lv: w for lv, w in self.config.dataset.rl_weights.items() if lv in by_level}
        if len(by_level) < 2 or len(set(weights.values())) < 2:  # equal shares: one draw from the pool
            return rng.sample(pool, min(n, len(pool)))
        quota = level_quota(weights, n)
        return [t for lv, k in quota.items() for t in rng.sample(by_level[lv], min(k, len(by_level[lv])))]

    def steps(self, n: int, tasks_per_step: int, label: str) -> Iterator[tuple[int, Tasks]]:
        """``(step, tasks)`` for ``n`` steps, tasks from :meth:`task_draws`, with a bar that starts at the steps a
        resumed run already did (their draws are replayed, not yielded)."""
        done = min(len(self.report.steps), n)
        with self.progress.phase(label, n, done=done) as bar:
            self._steps_bar = bar
            try:
                for step, tasks in zip(range(n), self.task_draws(tasks_per_step), strict=False):
                    if step < done:
                        continue
                    bar.note(f"step {step + 1}/{n}: rollouts")
                    yield step, tasks
                    reward = self.report.steps[-1].get("reward_mean") if self.report.steps else None
                    bar.advance(note="" if reward is None else f"reward {reward:.2f}")
            finally:
                self._steps_bar = None

    def step_note(self, what: str) -> None:
        """Say what the open step loop's current step is doing (``step 2/9: 3/8 groups ready``)."""
        bar = self._steps_bar
        if bar is not None:
            bar.note(f"step {bar.done + 1}/{bar.total}: {what}")

    @cached_property
    def collector(self) -> Collector:
        """The collector part (:mod:`spanlab.jobs.parts`): :meth:`collect`, and the rig's workers for a queue."""
        from spanlab.jobs.parts import Collector

        temperature = self.config.rollouts.temperature
        return Collector(self.collect, self.rig.collector, self.rig.gateway.flush, self.report.run_id,
                         lambda: self.served_name, {} if temperature is None else {"temperature": temperature})

    @cached_property
    def task_stream(self) -> TaskStream:
        """The task stream part: :meth:`steps`, :meth:`task_draws`, :meth:`draw`, :meth:`step_note`."""
        from spanlab.jobs.parts import TaskStream

        return TaskStream(self.steps, self.task_draws, self.draw, self.step_note, len(self.splits["rl"]))

    @cached_property
    def step_log(self) -> StepLog:
        """The step log part: :meth:`log_step`, the steps logged, :meth:`record_metrics`, :meth:`held_out`."""
        from spanlab.jobs.parts import StepLog

        return StepLog(self.log_step, lambda: len(self.report.steps), self.record_metrics, self.held_out)

    def trainer(self, step: TrainStep, make_optimizer: MakeOptimizer, *, lora: LoraConfig | None = None) -> Trainer:
        """The trainer of the job's policy around the algorithm's ``step`` function and optimizer, built from
        ``trainer:``, ``policies:`` (their adapters opened and served first) and ``--resume`` (the optimizer gets its
        saved moments back, and is saved with each step). Build it once, in ``run``."""
        from spanlab.jobs.trainer import build_trainer

        assert self.policy is not None, "a trainer trains weights: the framework loads the policy"
        adapters = self.open_policies() if self.config.policies is not None else None
        trainer = build_trainer(self.policy, self.config, self.stack, step, make_optimizer, lora=lora,
                                adapters=adapters)
        if trainer.optimizer is not None:  # one process: its state is saved for --resume
            self.attach_optimizer(trainer.optimizer)
        return trainer

    def train_policy(self, train: Callable[[torch.nn.Module], tuple[torch.nn.Module, dict[str, float]]]
                     ) -> dict[str, float]:
        """Run ``train`` on the policy's model and keep the model it returns (a round may wrap the model in LoRA
        or merge its adapter back in); its metrics. Pushes, checkpoints and the resume state then see that model."""
        assert self.policy is not None, "training needs the policy: the framework loads it"
        self.policy.model, metrics = train(self.policy.model)
        return metrics

    def record_metrics(self, metrics: dict[str, float]) -> None:
        """Metrics at the current step that are no step of their own: into ``train_metrics`` only."""
        self.rig.store.add_metrics(self.report.run_id, self.config.algorithm, len(self.report.steps), metrics)

    def attach_optimizer(self, optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
        """The algorithm's optimizer, saved with each step's state (and given its saved moments on --resume)."""
        self.optimizer = optimizer
        if self.resume_state is not None:
            from spanlab.training.resume import restore_optimizer

            restore_optimizer(self.resume_state, optimizer)
        return optimizer

    def save_state(self) -> None:
        """The trainer state after a completed phase, for --resume (when the algorithm can resume)."""
        if self.saves_state:
            from spanlab.training.resume import save_state

            save_state(self.config.run_dir, resuming.state_info(self),
                       self.policy.model if self.policy is not None else None, self.optimizer)

    def log_step(self, metrics: dict[str, float]) -> None:
        """One step's flat metrics: into the report, the resume state, ``train_metrics`` and the trackers."""
        step = len(self.report.steps)
        self.report.steps.append(metrics)
        self.save_state()
        self.rig.store.add_metrics(self.report.run_id, self.config.algorithm, step, metrics)
        self.tracker.log_metrics(metrics, step)
        checkpoints.after_step(self)
        self.curve_point(step + 1)

    def curve_point(self, done: int) -> None:
        """The learning curve's held-out point after ``done`` steps, where ``eval.curve`` asks for one (the final
        step's point is the final evaluation)."""
        curve = self.config.eval.curve
        if curve is not None and done % curve.every == 0 and done != self.planned_steps:
            for name, tasks in self._held_out_splits():
                if name in curve.splits:
                    self._evaluate(f"step-{done}", name, tasks)

    def held_out(self, phase: str) -> Evaluation:
        """Evaluate the current policy on every held-out split; into the report and ``train_metrics``.

        Returns the headline split's result (``eval.split``); the extra splits are reported beside it."""
        headline, *extra = self._held_out_splits()
        result = self._evaluate(phase, *headline)
        for name, tasks in extra:
            self._evaluate(phase, name, tasks)
        return result

    def _held_out_splits(self) -> list[tuple[str, Tasks]]:
        """``(name, tasks)`` of the headline split, then of each extra split."""
        return [(self.config.eval.split, self.splits["eval"])] + [
            (key.removeprefix("eval:"), tasks) for key, tasks in self.splits.items() if key.startswith("eval:")]

    def _evaluate(self, phase: str, split: str, tasks: Tasks) -> Evaluation:
        with self.progress.phase(f"{phase} eval {split}", len(tasks)) as bar:
            if self.evaluator is not None:  # APO's cached runner: it advances the bar itself
                batch = self.evaluator(tasks, phase, split, bar)
                bar.note(f"accuracy {batch.mean_reward:.1%}")
            else:
                metadata = {"phase": phase, "split": split, "run_id": self.report.run_id}
                batch = self.rig.collector.collect(tasks, mode="test", metadata=metadata,
                                                   on_finished=running_mean(bar, "accuracy {:.1%}"),
                                                   temperature=self.config.eval.temperature, model=self.served_name)
        by_level: dict[str, list[float]] = {}
        for task, reward in zip(tasks, batch.rewards, strict=True):
            by_level.setdefault(str(task.get("level", "all")), []).append(reward)
        recorded = rollout_metrics(self.rig.store, batch.rollout_ids)  # the agent's ctx.add_metric values
        result = Evaluation(phase=phase, split=split, n=len(tasks), accuracy=batch.mean_reward,
                            by_level={k: sum(v) / len(v) for k, v in sorted(by_level.items())},
                            seconds=batch.seconds, failed=batch.failed, rewards=list(batch.rewards),
                            metrics=metric_means(recorded.values()))
        logger.info("%s: held-out accuracy on %s %.1f%% (n=%d) in %.0fs", phase, split, 100 * result.accuracy,
                    result.n, result.seconds)
        if result.metrics:
            logger.info("%s: agent metrics on %s: %s", phase, split,
                        ", ".join(f"{k} {m.mean:.3f} (n={m.n})" for k, m in result.metrics.items()))
        self.report.evaluations.append(result)
        metrics = {}
        if not phase.startswith("step-"):
            suffix = phase if split == self.config.eval.split else f"{phase}_{split}"
            key = f"eval_accuracy_{suffix}"
            metrics = {key: result.accuracy, **{f"{key}/level_{k}": v for k, v in result.by_level.items()},
                       **{f"eval_{name}_{suffix}": m.mean for name, m in result.metrics.items()}}
        curve = self.config.eval.curve
        if curve is not None and split in curve.splits and not (phase == "base" and self.config.warm_start):
            metrics[f"curve_{split}"] = result.accuracy  # one series over steps: start, every few steps, final
        step = len(self.report.steps)
        self.rig.store.add_metrics(self.report.run_id, self.config.algorithm, step,
                                   {k: v for k, v in metrics.items() if "/" not in k})
        self.tracker.log_metrics(metrics, step)
        return result

    def warm_start(self) -> None:
        """The configured SFT warm start, pushed to the engine and evaluated (nothing when not configured)."""
        ws = self.config.warm_start
        if ws is None or self.policy is None:
            return
        from spanlab.jobs.role_warm_start import role_warm_start
        from spanlab.training.policy import warm_start

        started = time.monotonic()
        if ws.role_demos == "mined":  # every role on its own job's demonstrations (docs/multi_policy.md)
            metrics = role_warm_start(self)
        else:
            metrics = warm_start(self.policy, self.demonstrations.warm_start(), ws, progress=self.progress)
        self.report.warm_start = {**metrics, "seconds": time.monotonic() - started}  # the report's time table
        self.held_out("warm_start")

    @cached_property
    def demonstrations(self) -> Demonstrations:
        """The run's demonstrations (built once): what the warm start and GRPO's demonstration term train on."""
        from spanlab.jobs.parts import Demonstrations

        assert self.policy is not None, "demonstrations train weights: the framework loads the policy"
        return Demonstrations(self.rig.store, self.report.run_id, self.task_set, self.policy.tokenizer,
                              self.config.engine.model, self.splits["train"], self.splits["demos"],
                              self.config.warm_start)

    def open_policies(self) -> PolicyAdapters:
        """With ``policies:``: the policy's model gets an adapter per policy, each served as its first version
        (:mod:`spanlab.jobs.policies`). Once per job: a per-role warm start opens them before the algorithm's
        trainer does, which then gets the same adapters."""
        if self.policy_adapters is None:
            from spanlab.jobs.policies import open_policy_adapters

            policy, policies = self.policy, self.config.policies
            assert policy is not None and policies is not None, "policies need a weight-training job with policies:"
            policy.model, self.policy_adapters = open_policy_adapters(
                policy.model, policy.sync.client, self.rig.store, policies, engine_model=self.config.engine.model,
                run_dir=self.config.run_dir, on_served=self.rig.gateway.set_policy_version)
        return self.policy_adapters


def build_algorithm(config: TrainConfig) -> Algorithm:
    """The configured algorithm with its cross-section checks run (no engine, no torch unless it needs it)."""
    algorithm = load_algorithm(config.algorithm)(config)
    if config.warm_start is not None and not algorithm.trains_weights:
        raise ConfigError(f"warm_start: algorithm {config.algorithm!r} trains no weights; remove warm_start")
    if config.trainer.processes > 1 and not algorithm.data_parallel:
        raise ConfigError(f"trainer.processes: algorithm {config.algorithm!r} trains in one process; remove trainer")
    if config.trainer.device == "gpu" and not algorithm.trains_weights:
        raise ConfigError(f"trainer.device: algorithm {config.algorithm!r} trains no weights; remove trainer")
    if config.trainer.processes > 1 or config.trainer.device == "gpu":
        config.trainer.check_devices()
    if config.loop.mode == "async" and not algorithm.async_loop:
        raise ConfigError(f"loop.mode: algorithm {config.algorithm!r} has no async loop (grpo has); remove loop")
    if config.policies is not None and not algorithm.trains_policies:
        raise ConfigError(f"policies: algorithm {config.algorithm!r} trains one policy for every role; a policy per "
                          "role is trained by grpo (docs/multi_policy.md); drop policies")
    algorithm.check()
    return algorithm


def check_job(config: TrainConfig) -> tuple[Algorithm, TaskSet, dict[str, Tasks]]:
    """Everything ``spanlab train`` can check before an engine starts: the model folder, the algorithm's checks,
    the task splits, the agent and its kwargs and roles, LoRA targets against the model, the store's folder and
    file. ``spanlab train --check`` runs this only; a run goes on with the algorithm, task set and splits it
    built."""
    from spanlab.jobs.file_checks import check_store_file
    from spanlab.jobs.model_checks import check_lora_targets, check_model_folder, check_roles
    from spanlab.jobs.prompt import check_prompt
    from spanlab.jobs.rig import check_writable
    from spanlab.jobs.rig_backends import check_runner
    from spanlab.jobs.role_warm_start import check_role_demos
    from spanlab.runner.agent import load_agent

    check_model_folder(config)
    algorithm = build_algorithm(config)
    task_set = load_task_set(config.dataset.name)
    check_role_demos(config, task_set)
    splits = split_tasks(task_set, config, algorithm.train_tasks())
    # Built the way rollouts build it (they always pass the served model name), so a bad kwarg fails here.
    agent = load_agent(config.agent.name, {"model": config.engine.served_model_name or config.engine.model,
                                           **config.agent.kwargs})
    check_roles(config, agent)
    check_lora_targets(config, algorithm)
    check_prompt(config)
    check_writable(config.db, config.run_dir)
    check_store_file(config.db)
    check_runner(config.runner)
    from spanlab.jobs.tracking import check_tracking

    check_tracking(config.tracking)
    return algorithm, task_set, splits


def _interrupt(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt if signum == signal.SIGINT else SystemExit(128 + signum)


@contextmanager
def interrupts_stop_the_job() -> Iterator[None]:
    """Ctrl-C (and SIGTERM) raise in the main thread wherever it is, also inside a rollout batch's event loop.

    ``asyncio.run`` would otherwise turn SIGINT into a cancellation of its main task, which the agents'
    libraries (anyio cancel scopes, a task that counts a cancelled agent as ended by the store) can absorb,
    and the run went on. Raised this way, the interrupt leaves the loop at once; ``asyncio.run`` cancels the
    in-flight rollouts and the job's ExitStack stops the gateway and the engine and closes the store.
    """
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = {sig: signal.signal(sig, _interrupt) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        yield
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _load_resume_state(algorithm: Algorithm, config: TrainConfig) -> TrainState | None:
    """The saved state ``--resume`` continues from; None (a fresh start, with a warning) when there is none."""
    checkpoints.check_resumable(algorithm, config)
    from spanlab.training.resume import load_state

    state = load_state(config.run_dir)
    if state is None:
        logger.warning("--resume: no saved state in %s; starting the run from the beginning", config.run_dir)
        return None
    resuming.check_same_config(state, config)
    return state


def run_job(config: TrainConfig, *, console: Console | None = None, resume: bool = False) -> TrainReport:
    """Run the whole job ``config`` describes (``resume``: continue it from its saved state); returns (and
    writes) its report."""
    console = console or log_console()
    algorithm, task_set, splits = check_job(config)
    state = _load_resume_state(algorithm, config) if resume else None
    report = (TrainReport.model_validate(state.info["report"]) if state is not None else
              TrainReport(run_name=config.run_name, algorithm=config.algorithm, model=config.engine.model,
                          db=str(config.db), seed=config.rollouts.seed))
    earlier_s = report.seconds
    with interrupts_stop_the_job(), ExitStack() as stack:
        rig = open_rig(stack, config)
        progress = stack.enter_context(PhaseProgress(console))
        job = Job(config, rig, task_set, splits, report, progress, stack,
                  saves_state=algorithm.resumable and algorithm.trains_weights and config.checkpoints.resume_state
                  and config.trainer.processes == 1 and config.policies is None)
        if algorithm.steps_key is not None:  # the last step's curve point is the final evaluation
            job.planned_steps = int(getattr(algorithm.settings, algorithm.steps_key))
        job.tracker = open_trackers(config.tracking, run_id=report.run_id, run_name=config.run_name,
                                    run_dir=config.run_dir, resume=state is not None)
        stack.push(lambda kind, *_: job.tracker.close(ok=kind is None))
        job.tracker.log_params(config.shown())
        if algorithm.trains_weights:
            from spanlab.jobs.groups import policy_recorder
            from spanlab.training.policy import open_policy

            job.policy = open_policy(stack, model_name=config.engine.model, root_url=rig.root_urls or rig.root_url,
                                     on_served=rig.gateway.set_served_version, served=rig.served,
                                     record=policy_recorder(rig.store), run_dir=config.run_dir,
                                     lora=algorithm.policy_lora(),
                                     torch_threads=config.torch_threads, device=config.trainer.policy_device)
        from spanlab.jobs.prompt import check_prompt, store_prompt

        if (template := check_prompt(config)) is not None:
            store_prompt(rig.store, template, file=str(config.prompt), run_id=report.run_id)
        algorithm.prepare(job)
        if job.evaluator is None:
            job.evaluator = algorithm.evaluator()
        if state is not None:
            job.resume_state = state  # the optimizer's moments and the finished rollouts of the interrupted step
            resuming.resume(job, state)
        else:
            if config.eval.base:
                job.held_out("base")
            job.warm_start()
            job.save_state()
        algorithm.run(job)
        if report.steps:
            job.held_out("final")
        job.progress.close()
        algorithm.summarize(job)
        if config.checkpoints.final:
            checkpoints.write_checkpoint(job, "final")
        report.seconds = earlier_s + time.monotonic() - job.started
        report.write(config.run_dir / "report.json")
        _track_outputs(job)
    return report


def _track_outputs(job: Job) -> None:
    """The reward plot beside the report (``run_dir/reward.png``: train reward and the held-out curves; only when
    matplotlib is installed), and both as the trackers' artifacts."""
    run_dir, plot = job.config.run_dir, None
    try:
        from spanlab.jobs.plot import plot_run

        if job.report.steps:
            plot = plot_run(job.rig.store, run_dir / "reward.png", job.report.run_id,
                            headline=job.config.eval.split)
    except ImportError as exc:
        logger.info("no reward plot: %s", exc)
    if job.tracker.trackers:
        job.tracker.log_artifact(run_dir / "report.json")
        if plot is not None:
            job.tracker.log_artifact(plot)
