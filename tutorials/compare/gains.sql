-- The compare table in one query over the arms' stores: per arm and held-out split, the accuracy at the start and
-- at the end on the same tasks, the paired gain (points: the mean of end - start per task) with a 95% interval,
-- the share of answers whose calculator expression used more operations than the task needs (calc.extra_ops, the
-- agent's own metric spans) at the start and the end, and the training rollouts of the arm's own store.
--
-- Each store is ATTACHed read-only under its stage's name (run.py does it; by hand, in the duckdb shell:
--   ATTACH 'runs/compare/start.duckdb' AS start (READ_ONLY); ... AS grpo ...; ... AS apo_grpo ...;
--   .read tutorials/compare/gains.sql
-- ). The start's phase is warm_start (base: a start that only evaluated an earlier run's folder, run.py
-- --start-from); an arm's is final, or base for an APO search that kept its start prompt (no final ran). The interval is the normal approximation of the paired mean (1.96 standard errors);
-- table.md has the seeded percentile bootstrap of spanlab.compare on the same pairs.
WITH rollouts AS (
    SELECT 'start' AS arm, * FROM start.rollout_summary
    UNION ALL SELECT 'grpo', * FROM grpo.rollout_summary
    UNION ALL SELECT 'sft', * FROM sft.rollout_summary
    UNION ALL SELECT 'apo', * FROM apo.rollout_summary
    UNION ALL SELECT 'apo-grpo', * FROM apo_grpo.rollout_summary
), metric_spans AS (  -- what an agent measured besides its reward (ctx.add_metric): custom spans
    SELECT 'start' AS arm, attempt_id, name, sequence_id, attributes FROM start.spans WHERE kind = 'custom'
    UNION ALL SELECT 'grpo', attempt_id, name, sequence_id, attributes FROM grpo.spans WHERE kind = 'custom'
    UNION ALL SELECT 'sft', attempt_id, name, sequence_id, attributes FROM sft.spans WHERE kind = 'custom'
    UNION ALL SELECT 'apo', attempt_id, name, sequence_id, attributes FROM apo.spans WHERE kind = 'custom'
    UNION ALL SELECT 'apo-grpo', attempt_id, name, sequence_id, attributes FROM apo_grpo.spans WHERE kind = 'custom'
), extra_ops AS (  -- per attempt: its last calc.extra_ops value
    SELECT arm, attempt_id, arg_max((attributes->>'$.metric')::DOUBLE, sequence_id) AS extra_ops
    FROM metric_spans WHERE name = 'calc.extra_ops' GROUP BY ALL
), held_out AS (  -- per arm, phase, split and task: its latest evaluation (a failed rollout scores 0)
    SELECT arm, metadata->>'$.phase' AS phase, metadata->>'$.split' AS split, input->>'$.task_id' AS task_id,
           arg_max(coalesce(final_reward, 0), enqueue_time) AS reward,
           arg_max(last_attempt_id, enqueue_time) AS attempt_id, min(enqueue_time) AS enqueued
    FROM rollouts WHERE mode = 'test' GROUP BY ALL
), shown AS (  -- the phase each arm's row shows
    SELECT arm, CASE WHEN arm = 'start' AND bool_or(phase = 'warm_start') THEN 'warm_start'
                     WHEN arm <> 'start' AND bool_or(phase = 'final') THEN 'final' ELSE 'base' END AS phase
    FROM held_out GROUP BY arm
), paired AS (  -- the arm's evaluation and the start's, task by task
    SELECT a.arm, a.split, a.reward AS after, s.reward AS before, ea.extra_ops AS extra_after,
           es.extra_ops AS extra_before, s.enqueued
    FROM held_out a
    JOIN shown USING (arm, phase)
    JOIN held_out s ON s.arm = 'start' AND s.split = a.split AND s.task_id = a.task_id
    JOIN shown ss ON ss.arm = 'start' AND ss.phase = s.phase
    LEFT JOIN extra_ops ea ON ea.arm = a.arm AND ea.attempt_id = a.attempt_id
    LEFT JOIN extra_ops es ON es.arm = 'start' AND es.attempt_id = s.attempt_id
), training AS (  -- rollouts spent on training or search: every rollout not run for a held-out evaluation
    SELECT arm, count(*) FILTER (WHERE mode <> 'test') AS rollouts FROM rollouts GROUP BY arm
)
SELECT
    arm, split, count(*) AS n,
    round(100 * avg(before), 1) AS start_pct, round(100 * avg(after), 1) AS end_pct,
    round(100 * avg(after - before), 1) AS gain,
    round(100 * (avg(after - before) - 1.96 * coalesce(stddev_samp(after - before), 0) / sqrt(count(*))), 1)
        AS gain_low,
    round(100 * (avg(after - before) + 1.96 * coalesce(stddev_samp(after - before), 0) / sqrt(count(*))), 1)
        AS gain_high,
    round(100 * avg(extra_before), 1) AS start_extra_ops_pct, round(100 * avg(extra_after), 1) AS extra_ops_pct,
    any_value(t.rollouts) AS training_rollouts
FROM paired JOIN training t USING (arm)
GROUP BY arm, split
ORDER BY list_position(['start', 'grpo', 'sft', 'apo', 'apo-grpo'], arm), min(enqueued);
