"""Every default and bound of Ferry, in one place.

Invariants that these bounds protect are written next to them. Times are in seconds, sizes in bytes.
"""

PROTOCOL_VERSION = 1

#: The consumer's default ROUTER endpoint: this machine only, since without CURVE anyone who reaches the port may
#: feed the trainer. With torchrun, the port is shifted by LOCAL_RANK; a process's second loader takes the next slot
#: (consumer/io/ports.py).
DEFAULT_ENDPOINT = "tcp://127.0.0.1:5555"
#: The default with CURVE on: every interface, since only producers with an authorized key get in.
DEFAULT_CURVE_ENDPOINT = "tcp://*:5555"
#: A loader waiting for remote producers says so after this long without one, with the command that starts one,
#: and again every WAITING_NOTICE_EVERY_S while it waits. [Unit: second]
WAITING_NOTICE_S = 3.0
WAITING_NOTICE_EVERY_S = 30.0

# --- liveness (the Paranoid Pirate pattern) ---------------------------------------------------------
#: Each side sends PING this often. [Unit: second]
HEARTBEAT_S = 1.0
#: A peer silent for LIVENESS heartbeats is lost.
LIVENESS = 5
#: Bounds on the heartbeat a consumer's WELCOME may set on a producer. [Unit: second]
MIN_WELCOME_HEARTBEAT_S = 0.05
MAX_WELCOME_HEARTBEAT_S = 60.0

#: A producer that holds one task longer than this is dropped like a silent one, and its tasks are
#: re-issued: it guards against a hung dataset and against a live peer that never answers. [Unit: second]
DEFAULT_TASK_TIMEOUT_S = 120.0
#: A task lost this many times (dead producer, timeout, unusable answer) is poison: it raises instead of
#: being issued again, so one bad sample cannot stall a run forever.
DEFAULT_MAX_ATTEMPTS = 3

#: How long a producer lets its BYE leave a socket on shutdown: one message to one consumer, and nothing
#: waits on the producer's exit but its own process. [Unit: millisecond]
PRODUCER_BYE_LINGER_MS = 500
#: How long a consumer's close() waits for its producers to read its BYE (each answers it at once; a producer's
#: socket drops what it has not read when the connection goes: consumer/io/router.py) and lets what is queued leave:
#: shorter, since the training script waits on it, and a producer that misses the BYE still notices within its
#: liveness window. [Unit: millisecond]
CONSUMER_BYE_LINGER_MS = 200
#: A producer's DEALER reconnects after this long, doubling (plus jitter) up to the maximum. [Unit: millisecond]
#: Short, because local producers connect before their consumer binds: libzmq's first retry decides how soon
#: the first HELLO can go out (about 10-30 ms after the bind, against 100-200 ms at 100 ms).
RECONNECT_IVL_MS = 10
RECONNECT_IVL_MAX_MS = 2000
#: A producer's connect that has not completed within its liveness window, or within this if that is shorter, is
#: abandoned and tried again (ZMQ_CONNECT_TIMEOUT, common/deadlinks.py): the kernel would otherwise resend a SYN lost
#: to a down link ever further apart (4 s, 8 s, 16 s... after a minute of outage), connecting that long after the
#: link is back. Never shorter than this, a SYN's own first retransmission time, so that a tiny heartbeat cannot make
#: a link with a long round trip impossible to connect. [Unit: second]
MIN_CONNECT_TIMEOUT_S = 1.0
#: A producer whose CURVE key a consumer denied tries again with a fresh socket after this long, doubling up to
#: the maximum (libzmq never retries a denied handshake itself). [Unit: second]
AUTH_RETRY_FIRST_S = 0.5
AUTH_RETRY_MAX_S = 30.0
#: Most ports one ``tcp://HOST:LO-HI`` endpoint range may name.
MAX_PORT_RANGE = 256
#: A producer polls its sockets at least this often: a quarter heartbeat, never under POLL_MIN_MS.
POLL_HEARTBEAT_FRACTION = 0.25
POLL_MIN_MS = 10
#: How long a batch worker waits for a free pooled batch buffer before it allocates. [Unit: second]
BUFFER_ACQUIRE_TIMEOUT_S = 10.0
#: A sample error's message and traceback are cut to these many characters (both below MAX_TEXT).
REMOTE_MESSAGE_CHARS = 4096
REMOTE_TRACEBACK_CHARS = 16384
#: ``ferry pack`` starts a new shard file past this size. [Unit: byte]
DEFAULT_SHARD_BYTES = 1 << 30
#: Messages a producer reads from one socket before its loop turns to the others.
RECEIVE_BURST = 256

# --- logging --------------------------------------------------------------------------------------------
#: A warning a peer can repeat is logged at most this many times per window (see ferry.common.ratelimit).
LOG_LINES_PER_WINDOW = 10
#: [Unit: second]
LOG_WINDOW_S = 60.0
#: The producer's --log-level choices (given in any case), and its default.
LOG_LEVELS = ("DEBUG", "INFO", "WARNING", "ERROR")
DEFAULT_LOG_LEVEL = "INFO"
#: The producer's --log-format choices: plain lines, or one JSON object a line for an engine's log collector.
LOG_FORMATS = ("plain", "json")
DEFAULT_LOG_FORMAT = "plain"
#: Local producers log at this level unless the trainer's environment sets FERRY_LOG_LEVEL.
LOCAL_PRODUCER_LOG_LEVEL = "WARNING"

# --- flow control -----------------------------------------------------------------------------------
#: Capacity C of the consumer: batches buffered + tasks in flight <= C, always.
DEFAULT_BUFFER_BATCHES = 8
#: Batches a producer works on at once (its credit with one consumer is these and the tasks it takes ahead).
DEFAULT_SLOTS = 2
#: Upper bound on the slots a producer may claim, so that one peer cannot hoard the window.
MAX_SLOTS = 64
#: Loader threads per producer.
DEFAULT_THREADS = 4
#: ZeroMQ high-water marks. They are a sanity bound only; credits keep queues far below them.
SOCKET_HWM = 1000
#: Messages the consumer's ROUTER queues from one peer before libzmq stops reading that connection (TCP then
#: holds the sender back). A producer that follows the protocol has at most its credits (MAX_SLOTS batches) and
#: a few control messages a heartbeat outstanding, so this never holds one back; a peer that floods the consumer
#: is held to this many messages (each at most max_batch_bytes) in memory, where SOCKET_HWM let 1000 pile up
#: (tests/test_fuzz.py measured the consumer's RSS peaking 150 MB above its start under attack with 1000).
CONSUMER_RCVHWM = 2 * MAX_SLOTS

# --- message bounds (validation) ---------------------------------------------------------------------
#: Largest batch a consumer accepts by default. It is the consumer's ZMQ_MAXMSGSIZE (libzmq drops a
#: connection that sends a bigger frame) and the bound on a decoded batch's total array bytes.
DEFAULT_MAX_BATCH_BYTES = 1 << 31
#: The bound a consumer announces in WELCOME (``frame_bytes``): leaves up to it travel as one frame, larger
#: ones as frames of this size that the consumer copies back together (``Chunked``). libzmq allocates each
#: received frame with malloc; the consumer raises glibc's mmap threshold to HEAP_BLOCK_BYTES (32 MiB, glibc's
#: ceiling on 64-bit; see ferry.common.heap), so every frame below it is served from reused heap memory, with no
#: page fault. A frame at or above it is a fresh mmap every time: a page fault and a zeroed page per 4 KiB
#: (a 149 MB leaf sent whole: ~36k faults a batch). 24 MiB stays clear of the ceiling with room for libzmq's
#: and malloc's headers, and leaves the common batch sizes (up to 24 MiB a leaf) unsplit and uncopied.
#: Measured in docs/tuning.md#frame-size. [Unit: byte]
DEFAULT_FRAME_BYTES = 24 << 20
#: The bounds a producer clamps an announced ``frame_bytes`` into: a hostile or broken WELCOME can neither
#: make a batch exceed MAX_FRAMES frames (2 GiB / 4 MiB = 512) nor do more than send leaves unsplit. [Unit: byte]
MIN_FRAME_BYTES = 4 << 20
MAX_FRAME_BYTES = 1 << 31
#: Array frames smaller than this travel uncompressed whatever the codec: not worth a call (labels, small
#: leaves). Not to be confused with MIN_FRAME_BYTES, the smallest frame size a consumer may announce. [Unit: byte]
MIN_COMPRESS_FRAME_BYTES = 4096
#: Largest header frame (frame 0) we decode.
MAX_HEADER_BYTES = 1 << 20
#: Batch tree bounds: nesting depth, number of leaves, number of array frames, array rank.
MAX_TREE_DEPTH = 16
MAX_TREE_LEAVES = 4096
MAX_FRAMES = 1024
MAX_NDIM = 16
#: Tasks a producer holds for one consumer session at most; a consumer asking for more is broken.
MAX_PENDING_TASKS = 2 * MAX_SLOTS
#: Datasets a pool producer keeps open for its consumers besides its own (producer/loading/pool.py): each holds its files,
#: index and batch workers; a job naming one more closes one no connection uses, or is refused.
MAX_NAMED_DATASETS = 8
#: Invalid messages a producer takes from one consumer session before it drops that session (its work) and says
#: HELLO again: a broken or hostile consumer costs the producer's other consumers nothing more than its share.
MAX_INVALID_FROM_CONSUMER = 16
#: Largest number of sample indices in one TASK.
MAX_TASK_INDICES = 1 << 16
#: Largest dataset length a HELLO may announce.
MAX_DATASET_LEN = 1 << 48
#: Most shard lengths a HELLO may announce (a sharded dataset with more announces none: its len(loader) is not
#: known). 9 bytes each at most, well within MAX_HEADER_BYTES.
MAX_ANNOUNCED_SHARDS = MAX_TASK_INDICES
#: Most streams an iterable dataset may be split into (``iterable_streams``; each stream is a copy of the dataset
#: iterated by some producer, so more than the producers only costs re-reading: common/streamplan.py).
MAX_STREAMS = 4096
#: Longest free-text field (reasons, tracebacks) we keep from a peer.
MAX_TEXT = 64 * 1024
#: A sample error's ``exc_classes`` (its exception's class and bases, ``module:qualname``): at most this many
#: names (a chain to Exception is rarely longer than 4), each at most MAX_CLASS_PATH characters.
MAX_EXC_CLASSES = 16
MAX_CLASS_PATH = 512

# --- consumer waits -----------------------------------------------------------------------------------
#: Seconds without any live producer before __next__ raises NoProducersError.
DEFAULT_TIMEOUT_S = 60.0
#: Seconds between a loader's one-line progress logs.
DEFAULT_LOG_EVERY_S = 60.0
#: Slice of every bounded wait in the training and staging threads.
POLL_SLICE_S = 0.05
#: How long close() waits for each thread or process before escalating.
JOIN_TIMEOUT_S = 5.0
#: A local producer that dies is replaced (consumer/local/respawn.py): after RESPAWN_FIRST_DELAY_S, each further
#: time within RESPAWN_WINDOW_S after twice the delay before (at most RESPAWN_MAX_DELAY_S), and at most
#: RESPAWNS_PER_WINDOW times within RESPAWN_WINDOW_S: one that keeps crashing is then left dead. [Unit: second]
RESPAWN_FIRST_DELAY_S = 0.1
RESPAWN_MAX_DELAY_S = 5.0
RESPAWN_WINDOW_S = 60.0
RESPAWNS_PER_WINDOW = 5
#: A loader with local producers deals its first tasks one to each producer, the rest waiting until all of them
#: are live (or one died), at most this long after it started (consumer/core/dispatcher.py). [Unit: second]
DEAL_FIRST_TASKS_S = 30.0
#: local_producers="auto" (consumer/local/autoscale.py): the count changes at most once per control period, which
#: is the demand gauge's window (consumer/figures/demand.py: WINDOW_S), so each change rests on a window of
#: evidence of its own; a change against the direction of the last one waits AUTOSCALE_REVERSAL_S after it, so the
#: direction changes at most once a minute. [Unit: second]
AUTOSCALE_PERIOD_S = 5.0
AUTOSCALE_REVERSAL_S = 60.0
#: How long the watch thread waits for the io thread to let a local producer go before it asks it to stop anyway
#: (the io thread answers within one poll: at most 0.1 s plus the event in progress). [Unit: second]
LEAVE_WAIT_S = 1.0
#: Batches the staging thread may hold ready for the training loop (part of C, not extra).
STAGED_BATCHES = 2
#: Peers (or CURVE keys) whose first invalid message or denied handshake we remember, to log once per peer;
#: bounded for hostile input.
MAX_TRACKED_PEERS = 1024

# --- option ranges (checked up front, on both sides) ---------------------------------------------------
#: Heartbeat interval bounds of either side. [Unit: second]
MIN_HEARTBEAT_S = 0.01
MAX_HEARTBEAT_S = 60.0
#: A peer is lost after at least this many silent heartbeats (one late PING is not a death).
MIN_LIVENESS = 2
#: Upper bound on a producer's loader threads.
MAX_THREADS = 1024
#: A producer first warns when no consumer answered for this long (then after 3x, 6x, and every 30x more).
#: [Unit: second]
DEFAULT_UNREACHABLE_WARNING_S = 10.0
#: A producer resolves the host name of each --connect endpoint again this often, and follows what it finds:
#: one consumer connection per address (a headless Service, several trainers behind one name). 0: never (ZeroMQ
#: resolves the name itself, one connection per endpoint). [Unit: second]
DEFAULT_RESOLVE_INTERVAL_S = 10.0
#: Most addresses one name may resolve to: a producer opens no connection past them (and says so).
MAX_ADDRESSES_PER_NAME = 256
#: The live probe fails once a producer's main loop has not turned for this long. [Unit: second]
DEFAULT_STUCK_AFTER_S = 20.0
#: A producer all of whose loading threads (or slots) are held this long by loads its consumers gave up on exits
#: with status 5 (producer/core/stuck.py), for its supervisor to start a fresh one; as long as a consumer's own
#: task_timeout by default. [Unit: second]
DEFAULT_EXIT_WHEN_STUCK_S = DEFAULT_TASK_TIMEOUT_S
#: A producer rewrites its status file (--status-file) at most this far apart: every second, or a quarter of
#: --stuck-after if that is shorter, so that a live loop never looks stuck. [Unit: second]
STATUS_INTERVAL_S = 1.0
#: A stopping producer waits this long for the samples it is loading (their tasks were handed back with its BYE)
#: before it exits without them: its exit stays well within an engine's grace period (Docker's 10 s).
#: [Unit: second]
DEFAULT_DRAIN_TIMEOUT_S = 3.0
#: A local producer's --drain-timeout: its loader stops it (close, exit, Ctrl-C) and has its tasks back already;
#: a load still running is only a wait before the trainer can exit (DataLoader's workers are not waited for).
LOCAL_DRAIN_TIMEOUT_S = 0.5
#: The range of a loader's shuffle seed: torch.Generator.manual_seed's.
MIN_SEED = -(2**63)
MAX_SEED = 2**64 - 1
#: Largest TCP port (metrics ports; 0 is "none").
MAX_PORT = 65535
#: Largest batch size bound a loader accepts (an int64 byte count).
MAX_BATCH_BYTES_LIMIT = 2**63 - 1

# --- the relay (ferry relay, consumer/relay/; docs/relay-protocol.md) ---
#: The relay's protocol version: its hello says it, and a relay refuses a client of another version, saying both.
RELAY_PROTOCOL_VERSION = 1
#: Largest header a relay message may have (its 4-byte length says more: the peer is not speaking this protocol).
#: [Unit: byte]
RELAY_MAX_HEADER_BYTES = 1 << 20
#: Largest text part (an error's traceback, a state): a state of an iterable dataset's streams stays far below.
#: [Unit: byte]
RELAY_MAX_TEXT_BYTES = 16 << 20
#: Items (batches, errors, an epoch's end) a relay sends ahead of what its client consumed, unless the client's hello
#: asks for another window (at most the loader's buffer_batches): one to read while the next one travels.
RELAY_DEFAULT_WINDOW = 2
#: A relay says `ping` to its client when it sent nothing for this long, so that a client waiting for a slow batch
#: can tell a live relay from a dead one (R's socket reads time out). [Unit: second]
RELAY_HEARTBEAT_S = 5.0
#: A send to the relay's client that makes no progress for this long ends that connection (the client is stuck or
#: gone; a reconnect resends what it had not consumed). [Unit: second]
RELAY_SEND_TIMEOUT_S = 60.0
