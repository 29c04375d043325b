"""Task sets that are not one agent's own (registered by short name in :data:`spanlab.jobs.tasks.TASK_SETS`)."""
