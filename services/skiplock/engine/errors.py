"""The one exception tree of skiplock.

Each subclass names a condition. `status` is the HTTP status the API maps it to and `code` the
stable machine-readable name in error bodies; nothing else decides either.
"""

from __future__ import annotations


class SkiplockError(Exception):
    """Base of every error skiplock raises on purpose."""

    code = "skiplock.error"
    status = 500


class ConfigError(SkiplockError):
    """A setting is missing or invalid. The message names the variable and the value."""

    code = "config.invalid"
    status = 500


class InvalidInput(SkiplockError):
    """A caller passed something skiplock refuses (bad queue name, payload not JSON, ...)."""

    code = "request.invalid"
    status = 400


class PayloadTooLarge(InvalidInput):
    code = "task.payload_too_large"
    status = 413


class UnsupportedMediaType(InvalidInput):
    """A request body of a type the route does not read (the console reads only its own forms)."""

    code = "request.unsupported_media_type"
    status = 415


class TaskNotFound(SkiplockError):
    code = "task.not_found"
    status = 404


class TaskNotCancellable(SkiplockError):
    code = "task.not_cancellable"
    status = 409


class TaskNotResumable(SkiplockError):
    code = "task.not_resumable"
    status = 409


class WaitTimeout(SkiplockError, TimeoutError):
    """skiplock.wait gave up: the task was not final within its timeout."""

    code = "task.wait_timeout"
    status = 504


class ScheduleNotFound(SkiplockError):
    code = "schedule.not_found"
    status = 404


class LimitNotFound(SkiplockError):
    """No flow-control limit is set for the kind (skiplock.limits)."""

    code = "limit.not_found"
    status = 404


class MigrationError(SkiplockError):
    code = "migration.failed"
    status = 500


class DatabaseUnavailable(SkiplockError):
    """Postgres cannot be reached or dropped the connection; callers retry with backoff."""

    code = "database.unavailable"
    status = 503


class ConnectionLost(DatabaseUnavailable):
    """Postgres ended the connection while it was in use (pg_terminate_backend, a restart, a proxy
    or network path that reset it). The database itself may be fine: the next unit of work takes
    another connection, so a role retries at once instead of backing off further. A statement
    or COMMIT in flight may or may not have been applied: retry only what is safe to repeat (an
    enqueue with its idempotency key, a fenced outcome)."""


class StatementTimeout(DatabaseUnavailable):
    """Postgres cancelled a statement that ran past its statement timeout (the API's reads run
    under SKIPLOCK_API_STATEMENT_TIMEOUT_SECONDS): the database is busy or the query too broad."""

    code = "database.statement_timeout"
    status = 503


class DatabaseError(SkiplockError):
    """A statement failed for a reason that is not the caller's to fix (a constraint, a bug of
    ours); the driver's error is its cause. The API answers it as an unexpected error."""

    code = "database.error"
    status = 500


class DataRefused(DatabaseError):
    """The database refused a value (a string it cannot store, a number out of range)."""

    code = "database.data_refused"


class WebhookAddressRefused(InvalidInput):
    """A webhook URL resolves to an address deliveries may not reach (SSRF guard)."""

    code = "webhook.address_refused"
    status = 400


class WebhookNotFound(SkiplockError):
    code = "webhook.not_found"
    status = 404


class DeliveryNotFound(SkiplockError):
    code = "delivery.not_found"
    status = 404


class DeliveryNotDead(SkiplockError):
    """Only a dead delivery can be redelivered; a pending one is still being tried."""

    code = "delivery.not_dead"
    status = 409


# ---- the HTTP API (services/skiplock/api) ---------------------------------------------------

class IdempotencyConflict(SkiplockError):
    """An Idempotency-Key already names a task submitted with another body."""

    code = "task.idempotency_conflict"
    status = 409


class ScheduleExists(SkiplockError):
    """POST /v1/schedules names a schedule that exists (PATCH changes one)."""

    code = "schedule.exists"
    status = 409


class TooManyRequests(SkiplockError):
    """An admission bound of the API is full: the token's submission rate or concurrency, or the
    worker's room for large bodies or long-polls. `retry_after` is the Retry-After header's whole seconds."""

    code = "request.rate_limited"
    status = 429

    def __init__(self, message: str, retry_after: int = 1):
        super().__init__(message)
        self.retry_after = max(1, retry_after)


class RequestTimedOut(InvalidInput):
    """The client took longer than SKIPLOCK_API_BODY_TIMEOUT_SECONDS to send its request body."""

    code = "request.timeout"
    status = 408


class Unauthorized(SkiplockError):
    """No bearer token, or one that matches no configured token."""

    code = "auth.unauthorized"
    status = 401


class Forbidden(SkiplockError):
    """A valid token whose role is too weak for the route."""

    code = "auth.forbidden"
    status = 403


class RouteNotFound(SkiplockError):
    code = "request.not_found"
    status = 404


class MethodNotAllowed(SkiplockError):
    code = "request.method_not_allowed"
    status = 405


class ConsoleDisabled(SkiplockError):
    """The web console has no session key (SKIPLOCK_CONSOLE_SESSION_KEY): it signs nobody in."""

    code = "console.disabled"
    status = 503


class NameBoundReached(SkiplockError):
    """A submission names a new queue or kind past SKIPLOCK_API_MAX_QUEUES / _KINDS."""

    code = "task.name_limit"
    status = 409
