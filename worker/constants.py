"""Names shared by producers, workers and clients: task names, queues, Redis keys."""

TASK_EXECUTE = "toolcall.execute"
TASK_EXECUTE_BATCH = "toolcall.execute_batch"
DEFAULT_QUEUE = "toolcalls"
# Who a call is for: fair share and limits are per tenant (docs/concepts/tenants.md). A call that names none,
# stock Celery producers and raw LPUSHes included, belongs to the default tenant.
DEFAULT_TENANT = "default"
TENANT_PATTERN = r"^[A-Za-z0-9_.:-]{1,64}$"
# A message's header with the number of calls it carries (a batch: many). The scheduler counts calls, not
# messages, in its shares and limits; a message without it (a stock producer's) carries one.
CALLS_HEADER = "x-toolworker-calls"
# A message's header with when it was enqueued (Unix ms): how long the oldest call has waited is read from
# the tail of each list without decoding the body (worker/queue/ages.py). A stock producer's has none.
ENQUEUED_HEADER = "x-toolworker-enqueued-ms"
# Tenant -> "weight max_in_flight max_queued" (0: none), from the definitions' `tenants:`; written by
# worker/definitions/redis_store.py, read by the scheduler's scripts (worker/queue/scheduler.py) and the client.
TENANT_LIMITS_KEY = "toolworker:tenants:limits"
# Set by the take on a message of a tenant over its max_queued (a raw producer's): answered with exit 75.
OVER_QUOTA_HEADER = "x-toolworker-over-quota"

# Celery's Redis result backend stores results under this prefix and publishes on the same channel. The
# result keys (worker/queue/publisher.py: a key's presence marks its call answered) and dead letters
# (worker/queue/dead_letter.py; also written by worker/queue/webhooks.py, for a delivery given up) are each
# written and read by one module.
RESULT_KEY_PREFIX = "celery-task-meta-"
DEAD_LETTER_KEY = "toolcall:dead-letter"
DEAD_LETTER_MAX = 10_000
# Tool name -> Celery queue, for tools whose upstream has a queue of its own (bulkheads); written and
# read by worker/definitions/redis_store.py only.
ROUTES_KEY = "toolworker:routes"
# Written and read by worker/call/ratelimit.py only.
RATE_LIMIT_KEY_PREFIX = "toolworker:ratelimit:"
# A tenant's rate limit (worker/call/run.py), apart from the upstreams' whatever their names.
TENANT_RATE_LIMIT_KEY_PREFIX = "toolworker:tenant-ratelimit:"

REDACTED = "[redacted]"
# A header name or log key matching this (case-insensitive) holds a secret.
SECRET_NAME_PATTERN = r"token|secret|key|auth|password|cookie|session|credential"
MAX_ARGUMENTS_BYTES = 1024 * 1024
# Objects and arrays within each other in a call's arguments, at most: far past what a tool's schema
# describes, far short of what exhausts Python's stack in the code that walks them.
MAX_ARGUMENTS_DEPTH = 64
MAX_REDIRECTS = 5
# What OpenAI and Anthropic accept as a tool name, at most.
TOOL_NAME_MAX_CHARS = 64
DEFAULT_MAX_OUTPUT_CHARS = 16_000
DEFAULT_MAX_RESPONSE_BYTES = 8 * 1024 * 1024
# An upstream's own timeouts (per attempt), when its definition sets none.
DEFAULT_UPSTREAM_TIMEOUT_S = 10.0
DEFAULT_CONNECT_TIMEOUT_S = 3.0
# How long a client waits for a call's envelope when the caller says nothing; the longest a call may ask for.
DEFAULT_CALL_TIMEOUT_S = 60.0
MAX_CALL_TIMEOUT_S = 86_400.0
# An upstream's circuit breaker: open after this many consecutive failures, try again after the cool-down.
DEFAULT_CIRCUIT_THRESHOLD = 5
DEFAULT_CIRCUIT_COOLDOWN_S = 30.0
DEFAULT_MAX_CONCURRENCY = 100

# The tool kinds a worker answers, each by a handler of its own (worker/call/).
KIND_DEFINED = "defined"  # rendered from the definition's templates
KIND_HTTP_REQUEST = "http_request"  # the model gives method and URL; egress-checked
KIND_CATALOG = "catalog"  # answered by the worker from its definitions
KIND_MCP = "mcp"  # sent as `tools/call` to an MCP server (worker/mcp_client/)
KIND_PROGRAM = "program"  # code mode: a program run in the sandbox, its tool calls sent as child calls
HTTP_REQUEST_TOOL = "http_request"
# Code mode: the queued call that runs a program (worker/program/), its arguments `code` and `tools`.
PROGRAM_TOOL = "run_code"
# How long a client waits for a program by default: TOOLWORKER_CODE_TIMEOUT_SECONDS' default, and a little.
CODE_CALL_TIMEOUT_S = 130.0
# The upstream the built-in tools (catalog, http_request) are listed under.
WORKER_UPSTREAM = "toolworker"
# Other names models know the generic tool by.
TOOL_ALIASES = {"HttpRequestTool": HTTP_REQUEST_TOOL}
# The content the workers accept on the queue (Celery's accept_content).
ACCEPT_CONTENT = ("json",)

# The shared definitions store: versioned bundles of definitions files (worker/definitions/redis_store.py).
DEFINITIONS_VERSION_KEY = "toolworker:definitions:version"
DEFINITIONS_CURRENT_KEY = "toolworker:definitions:current"
DEFINITIONS_BUNDLE_PREFIX = "toolworker:definitions:bundle:"
# What workers on the file store serve (a hash: digest, files, announcedAt), so that a gateway serves it too.
FLEET_DEFINITIONS_KEY = "toolworker:definitions:fleet"

# MCP upstreams (docs/guides/mcp-upstreams.md): each one's tool listing, as its last refresh read it (a hash:
# upstream -> JSON), a number that grows on every change (what readers poll), and the lock one refresher holds.
MCP_LISTINGS_KEY = "toolworker:mcp:listings"
MCP_LISTINGS_VERSION_KEY = "toolworker:mcp:listings:version"
MCP_REFRESH_LOCK_PREFIX = "toolworker:mcp:refresh-lock:"
DEFAULT_MCP_REFRESH_S = 300.0
# An upstream tool's text, at most: a description longer than this, or a schema larger, is refused.
MAX_TOOL_DESCRIPTION_CHARS = 16_000
MAX_TOOL_SCHEMA_BYTES = 256 * 1024

# The agent gateway: a claim per callId it enqueues (value: the call's fingerprint), so a client that
# sends the same callId again is answered from that call instead of enqueuing it twice.
GATEWAY_CALL_KEY_PREFIX = "toolworker:gateway:call:"

# How far past its timeout a client may wait for a call: reading the result store once the timeout has
# passed, and telling a lost Redis from a call nobody answered, take at most this long.
CLIENT_SLACK_S = 2.0

# The audit trail: one entry per call the gateway takes (who, which tool, callId, exit code), capped by
# TOOLWORKER_AUDIT_STREAM_MAXLEN; written by worker/gateway/identity/audit.py, read by `toolworker audit`.
AUDIT_STREAM_KEY = "toolworker:audit"
