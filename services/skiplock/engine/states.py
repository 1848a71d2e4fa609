"""A task's states (the tasks.state column's CHECK lists the same)."""

WAITING, QUEUED, RUNNING, CANCELLING = "waiting", "queued", "running", "cancelling"
COMPLETED, FAILED, CANCELLED = "completed", "failed", "cancelled"
STATES = (WAITING, QUEUED, RUNNING, CANCELLING, COMPLETED, FAILED, CANCELLED)
FINISHED_STATES = (COMPLETED, FAILED, CANCELLED)
