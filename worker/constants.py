"""Names shared by producers, workers and clients: task names, queues, Redis keys."""

TASK_EXECUTE = "toolcall.execute"
TASK_EXECUTE_BATCH = "toolcall.execute_batch"
DEFAULT_QUEUE = "toolcalls"

# Celery's Redis result backend stores results under this prefix and publishes on the same channel.
RESULT_KEY_PREFIX = "celery-task-meta-"
# SET NX on this key before publishing makes result publication exactly-once per callId.
DONE_KEY_PREFIX = "toolcall:done:"
DEAD_LETTER_KEY = "toolcall:dead-letter"
DEAD_LETTER_MAX = 10_000
# Tool name -> Celery queue, for tools whose upstream has a queue of its own (bulkheads).
ROUTES_KEY = "toolworker:routes"
RATE_LIMIT_KEY_PREFIX = "toolworker:ratelimit:"

REDACTED = "[redacted]"
# A header name or log key matching this (case-insensitive) holds a secret.
SECRET_NAME_PATTERN = r"token|secret|key|auth|password|cookie|session|credential"
MAX_ARGUMENTS_BYTES = 1024 * 1024
MAX_REDIRECTS = 5
DEFAULT_MAX_OUTPUT_CHARS = 16_000
DEFAULT_MAX_RESPONSE_BYTES = 8 * 1024 * 1024
DEFAULT_TIMEOUT_S = 10.0
DEFAULT_CONNECT_TIMEOUT_S = 3.0

# The shared definitions store: versioned bundles of definitions files.
DEFINITIONS_VERSION_KEY = "toolworker:definitions:version"
DEFINITIONS_CURRENT_KEY = "toolworker:definitions:current"
DEFINITIONS_BUNDLE_PREFIX = "toolworker:definitions:bundle:"

# The agent gateway: a claim per callId it enqueues (value: the call's fingerprint), so a client that
# sends the same callId again is answered from that call instead of enqueuing it twice.
GATEWAY_CALL_KEY_PREFIX = "toolworker:gateway:call:"
