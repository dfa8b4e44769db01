/* SPDX-License-Identifier: MIT */
/*
 * wex.h - the public C API of wex, the weight-exchange service.
 *
 * A trainer rank (producer) exports its weight memory once and publishes
 * versions; an inference rank (consumer) attaches and, before each rollout,
 * syncs the newest published version by remapping the producer's memory
 * (zero copy) or by copying in place only the slices it needs.
 *
 * Conventions: every function returns 0 or a positive count on success and a
 * negative errno value (or a negative WEX_E* code) on failure.  Output
 * parameters come last and are written only on success.  Each function's
 * comment says whether it blocks and who owns what.  Handles are opaque and
 * not thread-safe: use one client per thread or serialise calls.
 */
#ifndef WEX_H
#define WEX_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define WEX_API __attribute__((visibility("default")))

/* Control protocol version spoken by this library and wexd. */
#define WEX_PROTO_VERSION 1

#define WEX_NAME_MAX 160 /* tensor names, model names, including the NUL */
#define WEX_MAX_DIMS 8

/* wex-specific error codes, returned negated like errno values. */
#define WEX_ERRNO_BASE 4096
enum wex_errno {
	WEX_EPROTO_VERSION = WEX_ERRNO_BASE, /* peer speaks another protocol */
	WEX_ENOCUDA,     /* no CUDA driver (libcuda.so.1) or no device */
	WEX_ELAYOUT,     /* layouts differ where they must match, or cannot exist */
	WEX_EDIRTY,      /* the consumer's weights are half-written: re-sync */
	WEX_ENOPUBLISHED,/* no producer has registered the model yet (fetch) */
	WEX_EDAEMON,     /* wexd closed the connection or is shutting down */
	WEX_ENOMODEL,    /* unknown model (reserved: wexd makes a model when a
			  * client first names it, so none is unknown) */
	WEX_EREMOTE,     /* wexd answered with an error code this library lacks */
	WEX_EVERIFY,     /* a verified sync found weights that differ from the published version */
	WEX_ERRNO_END
};

/* Returns a static, human-readable string for a negative (or positive) error
 * code.  Never blocks; never returns NULL. */
WEX_API const char *wex_strerror(int err);

/* Frees memory that a wex function handed to the caller (JSON strings). */
WEX_API void wex_free(void *p);

/* ---------------------------------------------------------------------- */
/* Element types (safetensors' names in wex_dtype_name).                  */

enum wex_dtype {
	WEX_DT_INVALID = 0,
	WEX_DT_BOOL, WEX_DT_U8, WEX_DT_I8, WEX_DT_I16, WEX_DT_U16,
	WEX_DT_F16, WEX_DT_BF16, WEX_DT_I32, WEX_DT_U32, WEX_DT_F32,
	WEX_DT_I64, WEX_DT_U64, WEX_DT_F64, WEX_DT_F8_E4M3, WEX_DT_F8_E5M2,
	WEX_DT_F8_E8M0, /* an exponent: MX block scales */
	WEX_DT_COUNT
};
/* Size of one element in bytes, or 0 for an invalid type. */
WEX_API size_t wex_dtype_size(int dtype);
/* Safetensors name ("BF16") or NULL. */
WEX_API const char *wex_dtype_name(int dtype);
/* Inverse of wex_dtype_name; WEX_DT_INVALID if unknown. */
WEX_API int wex_dtype_from_name(const char *name);

/* ---------------------------------------------------------------------- */
/* Tensors.                                                               */

/*
 * One physical tensor (or one piece of one): it holds the box
 * [start, start+extent) of canonical tensor `name`, whose full (global)
 * shape is `shape`.  An unsharded tensor has start 0 and extent == shape.
 *
 * Where it lives: for a producer, `segment` (an id returned by
 * wex_segment_alloc or wex_segment_register_*) and `offset` bytes into it;
 * for a consumer, `ptr`.
 * `strides` are in elements, outermost first, never negative; all zero
 * means C-contiguous.
 */
struct wex_tensor {
	char name[WEX_NAME_MAX];
	int32_t dtype;
	uint32_t ndim;
	uint64_t shape[WEX_MAX_DIMS];
	uint64_t start[WEX_MAX_DIMS];
	uint64_t extent[WEX_MAX_DIMS];
	int64_t strides[WEX_MAX_DIMS];
	uint32_t segment;
	uint64_t offset;
	void *ptr;
};

/* Number of bytes the tensor's box spans when contiguous: UINT64_MAX when
 * that does not fit in 64 bits, 0 for an empty box, an unknown dtype or a
 * NULL t. */
WEX_API uint64_t wex_tensor_nbytes(const struct wex_tensor *t);

/* ---------------------------------------------------------------------- */
/* Clients.                                                               */

typedef struct wex_client wex_client_t;

enum wex_role { WEX_ROLE_PRODUCER = 1, WEX_ROLE_CONSUMER = 2, WEX_ROLE_ADMIN = 3 };

enum wex_client_field {
	WEX_CLIENT_FIELD_SOCKET = 1u << 0,
	WEX_CLIENT_FIELD_ROLE = 1u << 1,
	WEX_CLIENT_FIELD_MODEL = 1u << 2,
	WEX_CLIENT_FIELD_GROUP = 1u << 3,
	WEX_CLIENT_FIELD_RANK = 1u << 4,
	WEX_CLIENT_FIELD_TIMEOUT = 1u << 5,
	WEX_CLIENT_FIELD_COPY_THREADS = 1u << 6,
	WEX_CLIENT_FIELD_DEVICE = 1u << 7,
	WEX_CLIENT_FIELD_FLAGS = 1u << 8,
};

enum wex_client_flag {
	/* A producer opens without its watch: the thread that reconnects
	 * as soon as wexd is back after a restart, between the producer's
	 * calls, and gives the new wexd the version its memory still holds
	 * (published, no write begun since).  Without it, that waits for
	 * the producer's next call, and consumers waiting for the version
	 * meanwhile time out. */
	WEX_CLIENT_NO_WATCH = 1u << 0,
	/* A signal whose handler interrupts the wait of wex_sync or
	 * wex_begin_write for wexd's answer (ppoll() ends with EINTR) ends that
	 * wait, as wex_cancel would, and the call returns -EINTR (-ECANCELED
	 * when wex_cancel asked too).  For runtimes whose signal handlers run
	 * only once the call returns: Python's KeyboardInterrupt (Ctrl-C) would
	 * otherwise wait up to the wait's timeout; the wex module sets it, and
	 * calls again, for what is left of the timeout, when no handler raised.
	 * Signals that end no wait are held on the calling thread through it
	 * (their handlers run after): SIGCHLD, SIGWINCH, SIGURG, SIGPROF,
	 * SIGVTALRM, SIGPIPE, SIGIO and the real-time ones.  From the request's
	 * send to the wait, the calling thread holds every signal but those of
	 * faults, so one sent to it in between is handled in the wait, not
	 * lost; so too through a reconnect to a wexd that went away, from its
	 * connect to its last answer.  A wex_publish, or a wex_sync before its
	 * acquire, waits for the GPU work (cuCtxSynchronize) on a thread of its
	 * own while the calling thread waits for it as it waits for wexd: a
	 * signal taken there (its handler runs at once) ends the sync before it
	 * acquires, and ends the publish's next wait as if it came there (its
	 * wait for wexd's answer gets 3 s, below; a reconnect's hello ends at
	 * once); the GPU wait itself runs to its end.  One handled in the
	 * microseconds between a retry's nap and its next connect, or by
	 * another thread (a process-directed signal while this one holds them),
	 * ends no wait.  A wex_begin_write or wex_publish that waits for the
	 * producer's watch (reconnecting to a wexd that came back: it registers
	 * everything again first) ends there, at once, as on wex_cancel.
	 * Against a wexd that predates cancels, nothing ends but a sync whose
	 * GPU wait took a signal.  A wexd that answers nothing within 3 s of
	 * the signal (stopped, deadlocked: it never answers the cancel) has the
	 * connection dropped, and the call returns -EINTR; so too for the hello
	 * of a reconnect made on the calling thread, for its registrations
	 * after wexd answered that hello (the next call reconnects in full),
	 * and for wex_publish (see there: a publish so given up is safe to call
	 * again), and for a registration call of its own (see wex_cancel:
	 * nothing of it kept; -EINTR).  Without the flag a signal ends no wait. */
	WEX_CLIENT_EINTR = 1u << 1,
};

struct wex_client_params {
	uint64_t field_mask;   /* which fields below are set (WEX_CLIENT_FIELD_*) */
	const char *socket;    /* default: $WEX_SOCKET, $XDG_RUNTIME_DIR/wex/wexd.sock, /run/wex/wexd.sock */
	int role;              /* enum wex_role, required */
	const char *model;     /* required for producers and consumers */
	const char *group;     /* consumer group (one engine instance); default "default" */
	uint32_t rank;         /* this process's rank in its group */
	uint32_t world_size;   /* ranks in its group (producer N or consumer M);
				* both under WEX_CLIENT_FIELD_RANK (without
				* it: rank 0 of 1, whatever they say) */
	uint32_t timeout_ms;   /* default timeout of blocking calls; default 30000,
				* except the waits of wex_begin_write and wex_sync,
				* which without it (and without one of their own)
				* last as long as wexd's begin_write_timeout_ms and
				* sync_timeout_ms say (30 s and 60 s by default) */
	uint32_t copy_threads; /* threads for host copies; default min(8, cores) */
	int device;            /* CUDA ordinal (in this process) of a consumer's
				* reserved regions; default: the producer
				* segment's device, found by UUID */
	uint32_t flags;        /* WEX_CLIENT_NO_WATCH, WEX_CLIENT_EINTR; default 0 */
};

/*
 * Connects to wexd and introduces this process (hello).  Blocks for one
 * round trip.  On success *out is a new client that the caller closes with
 * wex_client_close.  Errors: -ENOENT/-ECONNREFUSED (no daemon), -EACCES
 * (refused by wexd's access control), -ECONNRESET or -EPIPE (wexd closed
 * the connection at once: max_clients reached, or it is draining),
 * -EAGAIN (its queue of connections stayed full for the timeout plus 5 s:
 * a hung daemon; with WEX_CLIENT_EINTR a signal its caller handles ends
 * that wait with -EINTR, one that ends no wait does not), -ETIMEDOUT
 * (wexd took the connection but did not answer hello within the timeout
 * plus 5 s: a stopped or hung daemon), -WEX_EPROTO_VERSION, -EINVAL
 * (among others, a model or group name of WEX_NAME_MAX bytes or more, or
 * a socket path of 256 bytes or more: refused, never cut short),
 * -EADDRINUSE (the rank is held by another connection that is still open;
 * one whose process already died is taken over).  On failure
 * wex_last_error(NULL) says why (wexd's reason, or the socket path that
 * could not be reached), in the calling thread.
 *
 * A producer's client runs one thread of its own, its watch, unless
 * WEX_CLIENT_NO_WATCH: when wexd goes (a restart), it reconnects as soon
 * as wexd is back, without waiting for the producer's next call, and
 * re-registers the segments and tensors; the version last published
 * stays visible to consumers when no write was begun since (else a write
 * begun goes on).  The watch acts only between the producer's calls.
 *
 * A client belongs to the process that opened it.  After fork() the
 * child's copy holds no connection and no segment fd (libwex closes them
 * in the child at once, so the parent's death still ends its leases and
 * frees its ranks even while the child lives); every call on the copy
 * returns -ECHILD, and wex_client_close there only frees it.  A child that
 * needs wex opens its own client.
 */
WEX_API int wex_client_open(const struct wex_client_params *params, wex_client_t **out);

/* Releases every lease and mapping the client holds, closes every fd it
 * owns and frees it.  A consumer's same-address regions (wex_reserve) are
 * unmapped, whatever they show: pointers into them are invalid from then
 * on.  Blocks for at most one round trip (about 7 s at most when wexd does
 * not answer), after waiting for this process's queued GPU work (as
 * wex_release does) when it holds a lease. */
WEX_API void wex_client_close(wex_client_t *c);

/* ---------------------------------------------------------------------- */
/* Producers.                                                             */

enum wex_seg_kind {
	WEX_SEG_HOST = 1,
	WEX_SEG_CUDA_VMM = 2,
	WEX_SEG_CUDA_IPC = 3,
	WEX_SEG_HOST_PINNED = 4, /* wex_segment_alloc only: see below */
};

/*
 * Allocates exportable memory of `size` bytes of `kind` (WEX_SEG_HOST: a
 * memfd mapped shared; the CUDA kinds on device `device`, an ordinal of this
 * process) and registers it with wexd.  WEX_SEG_HOST_PINNED is host
 * staging for GPUs without peer access: a WEX_SEG_HOST segment that is
 * also page-locked (cuMemHostRegister, portable) with `device` current, so
 * the trainer's device-to-host copies into it run at link speed; consumers
 * see a host segment (and pin their own mapping when they copy it onto a
 * GPU, see wex_sync).  It needs a CUDA driver (-WEX_ENOCUDA) and pins all
 * `size` bytes at once (the driver's error, e.g. -ENOMEM, otherwise).  The memory belongs to the client and
 * lives until wex_client_close (wexd keeps its own reference while any
 * consumer holds it).  *id receives the segment id for wex_tensor.segment,
 * *ptr its address in this process.  Blocks for one round trip.
 */
WEX_API int wex_segment_alloc(wex_client_t *c, int kind, int device, uint64_t size,
			      uint32_t *id, void **ptr);

/*
 * Registers memory the caller already has as a host segment: `fd` is a
 * memfd (or any mmap-able file) of at least `size` bytes mapped at `ptr` in
 * this process.  The fd stays the caller's; wex sends a duplicate.  Blocks
 * for one round trip.  -EINVAL, wex_last_error() saying which, for an fd
 * below 0, a size of 0 or a file shorter than `size` (a pipe, a socket or
 * a directory holds none).  Every consumer gets an fd of the file: a
 * memfd (tmpfs, hugetlbfs) opened again O_RDONLY (by libwex here, else by
 * wexd where it may); any other file (one on disk) as it is, open as `fd`
 * is.
 * Read-only is not enough: a consumer may open /proc/self/fd/N again
 * writable where the file's mode allows (a memfd's is 0777), and a file
 * shrunk under a consumer's mapping kills it with SIGBUS.  Seal a memfd
 * F_SEAL_SHRINK | F_SEAL_GROW and, once mapped, F_SEAL_FUTURE_WRITE, as
 * wex_segment_alloc does, to keep consumers from writing or cutting it.
 */
WEX_API int wex_segment_register_fd(wex_client_t *c, int fd, void *ptr, uint64_t size,
				    uint32_t *id);

/*
 * Registers GPU memory the caller already has, without copying it:
 * WEX_SEG_CUDA_VMM for exportable VMM memory (from wex_cuda_alloc, or
 * PyTorch's segments under PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True;
 * the newer PYTORCH_ALLOC_CONF alone is ignored for it by torch 2.9.1),
 * WEX_SEG_CUDA_IPC for plain cudaMalloc memory (the handle of its allocation
 * plus the offset).  A VMM range may span several allocations mapped back
 * to back (an expandable segment grows by 2 MiB / 20 MiB chunks): each is
 * exported, and consumers map them back to back again, so offsets in the
 * range keep their meaning.  A cudaMalloc range must lie in one
 * allocation (-E2BIG otherwise).  -EINVAL for a NULL ptr, a size of 0,
 * or a range past the end of the address space.  -EOPNOTSUPP when the
 * memory was not created exportable (vLLM's CuMemAllocator,
 * torch_memory_saver), with the reason in wex_last_error().  The memory stays the caller's; it must
 * outlive the registration (wex_client_close).  Blocks for one round trip
 * per allocation.
 */
WEX_API int wex_segment_register_ptr(wex_client_t *c, int kind, void *ptr, uint64_t size,
				     uint32_t *id);

/*
 * Registers (replacing any earlier table) the tensors this rank owns.  The
 * array is copied; the caller keeps it.  Blocks for one round trip.
 * Errors: -EINVAL naming the bad tensor in the daemon's log and in
 * wex_last_error(); -EOVERFLOW, naming it, for one whose bytes do not fit
 * in 63 bits; -EPERM for a client that is not a producer.
 */
WEX_API int wex_register_tensors(wex_client_t *c, const struct wex_tensor *t, size_t n);

/*
 * Announces that this rank is about to overwrite its weights with `version`
 * (greater than every earlier one).  Blocks until no consumer lease holds the
 * buffer, at most `timeout_ms` (0: the client's timeout_ms if set, else wexd's
 * begin_write_timeout_ms); -EBUSY on timeout, naming the holders in
 * wex_last_error(); -ECANCELED when wex_cancel ended the wait (nothing begun),
 * -EINTR when a signal did (WEX_CLIENT_EINTR); -EINVAL for a version over
 * 2^63-1 (JSON's largest integer), nothing sent; -EALREADY, nothing begun, for
 * the version this rank's last wex_publish published (one that succeeded, as
 * one whose caller's runtime raised as it returned may not know), or for that
 * of a wex_publish that failed (-EINTR, -ECANCELED, -ETIMEDOUT) but that wexd
 * carried out, as a reconnect found (see wex_publish): it is published, and
 * the next write is of a newer version.  When wexd goes away (a
 * restart, a crash), the call connects again and resends, trying until that
 * timeout (the client's when 0) ends: then wexd's error (-WEX_EDAEMON,
 * -ECONNREFUSED, -ENOENT); wex_cancel and signals (WEX_CLIENT_EINTR) end those
 * tries as they end a wait.  A wexd that takes the connection but does not
 * answer (hung), or whose queue of connections stays full, is waited on no
 * longer than that timeout either (-ETIMEDOUT, -EAGAIN), and wex_cancel and
 * signals end that wait too (as they do in wex_sync and wex_publish).
 * -ESTALE, nothing begun, when memory registered with
 * wex_segment_register_ptr (CUDA VMM: PyTorch's expandable segments; or
 * legacy IPC: cudaMalloc memory) was freed and other memory allocated at
 * its address, or none (a trainer's parameter offload, then
 * torch.cuda.empty_cache()): consumers would go on reading the memory
 * registered (VMM: wex still holds it; legacy IPC: their handle names
 * it), not the new one; register the parameters again (a new client) once
 * they are back.
 */
WEX_API int wex_begin_write(wex_client_t *c, uint64_t version, uint32_t timeout_ms);

/*
 * Publishes `version`: the caller's writes are complete.  For CUDA
 * segments it first waits until every piece of work queued on their
 * devices completed (cuCtxSynchronize of each device's primary context:
 * all streams, including non-blocking ones), so consumers never see a
 * version before the kernels that wrote it finished.  With host segments
 * in a process that uses CUDA (host staging: the trainer fills them with
 * asynchronous device-to-host copies), it waits the same way for the GPU
 * work of the calling thread's context.  The version becomes
 * visible to consumers once all N ranks of the producer group have
 * published it.  Blocks for that GPU wait and one round trip (not for the
 * other ranks); when no wexd answers (a restart), it is sent again until
 * the client's timeout_ms, as wex_begin_write is, and wex_cancel or a
 * signal (WEX_CLIENT_EINTR) ends those tries with -ECANCELED or -EINTR:
 * the version is then not published (publish it again).  Called again
 * for the same version right after -EINTR, it tries until the interrupted
 * call's time ends, not for timeout_ms anew: a caller that re-calls after
 * each signal whose handler let it go on waits timeout_ms in all.  A wexd
 * that takes the publish but answers nothing (stopped, deadlocked) gets
 * 3 s after a wex_cancel or such a signal; then the connection is dropped
 * and the call returns -ECANCELED or -EINTR (before its timeout, which
 * ends it as -ETIMEDOUT).  Whether wexd published the version is then
 * unknown until it answers: called again for the same version, the call
 * reconnects and finds out (wexd runs no request of a client that hung
 * up; one it ran just before shows as the version published in its
 * answer to hello): published, the call returns 0 without asking again
 * (the rank holds the version); not, the write is begun again and the
 * version published.  Either way the version reaches the engines once.
 * Such a signal that comes during the GPU wait counts once that wait
 * ended (see WEX_CLIENT_EINTR): the publish is then sent and gets those
 * 3 s (where the connection must be made again first, the call ends
 * instead at once, nothing sent).  -ESTALE, nothing published, as in
 * wex_begin_write, for registered memory freed and allocated again since.
 */
WEX_API int wex_publish(wex_client_t *c, uint64_t version);

/* ---------------------------------------------------------------------- */
/* Consumers.                                                             */

enum wex_sync_mode {
	WEX_SYNC_COPY = 1,        /* copy the needed slices into the consumer's buffers */
	WEX_SYNC_REMAP_VIEW = 2,  /* map the producer's memory; read through wex_view */
	WEX_SYNC_REMAP_FIXED = 3, /* map the producer's memory over the consumer's buffers */
	/* Or'ed into the mode of a COPY or REMAP_FIXED sync: before the lease
	 * ends, compare every byte of the attached layout with the
	 * producer's memory (see wex_sync). */
	WEX_SYNC_VERIFY = 1 << 8,
};

/*
 * Describes this consumer rank's own weights (its engine layout): the
 * tensors it serves, each with `ptr` set.  Needed for WEX_SYNC_COPY (the
 * plan converts between layouts).  WEX_SYNC_REMAP_FIXED needs only
 * wex_reserve; attached tensors that lie in a reserved region must sit
 * where the producer's do (-WEX_ELAYOUT from the sync otherwise).  The
 * array is copied; the buffers stay the caller's.  Blocks for one round trip
 * (wexd keeps the layout; it plans the copy, and caches the plan, when a
 * sync or wex_reserve next fetches).  A layout in GPU memory names its GPU
 * (by UUID; a layout over several GPUs, its first piece's): an element
 * that producer ranks hold in segments on that GPU is copied from one of
 * those segments (a local copy), never from a replica elsewhere.
 * A requested element with no source (another dtype or full shape than
 * the producers', a box they do not hold) is found by that plan: the
 * next fetch (wex_sync, wex_reserve) fails with -WEX_ELAYOUT naming it,
 * not this call; so does a tensor whose plan would take over 2^30 steps
 * or cut the consumer's pieces into over 2^22 cells more than 16 for
 * each producer piece over one of them (thousands of producer pieces of
 * it overlapping each other: no real sharding comes near that).  Errors: -EFAULT
 * when a tensor lies where the CUDA driver knows a reserved address range
 * with nothing mapped (GPU memory the engine released and kept the
 * addresses of: vLLM's sleep mode, torch_memory_saver's pause), naming
 * the one at the lowest address, nothing attached; -EINVAL, nothing
 * attached, for a tensor without ptr or one whose elements overlap,
 * naming it (-EOVERFLOW for one whose bytes do not fit in 63 bits): a
 * copy writes every element, so each needs bytes of its
 * own (a stride of 0 on a dim of extent > 1, or strides too small for
 * the dims inside them).  Strides whose dims of extent > 1, by stride,
 * are nested (each stride at least the one below times its extent) are
 * taken at once; other strides are taken when no two of the tensor's
 * elements share an address, compared one by one up to 2^20 elements,
 * and refused above that (they may overlap), as wex.torch_util's
 * attach_module does.  -EINVAL too for two tensors whose bytes (first to
 * last, strides included) overlap, naming both: overlapping pieces of
 * one buffer, or interleaved strided views of it, also in the client's
 * regions.  One tensor under two names (the same address, dtype, box and
 * strides: tied weights, as reserve_like mirrors a producer's) is taken:
 * the trainer must hold the same bytes under both names.  A producer's
 * tensors may share memory (they are only read).
 */
WEX_API int wex_attach(wex_client_t *c, const struct wex_tensor *t, size_t n);

/*
 * Reserves `size` bytes of page-aligned memory that WEX_SYNC_REMAP_FIXED can
 * later replace with the producer's memory at the same address.  The
 * consumer places its weights there exactly as producer rank `prank` places
 * them in its segment `segment` (same offsets).  *ptr belongs to the client
 * and is unmapped by wex_client_close.  The first call learns the
 * producers' segments from wexd, waiting up to the client's timeout for
 * every producer rank to register its tensors (a consumer may start
 * first); the region is of the segment's kind, on the client's device
 * (WEX_CLIENT_FIELD_DEVICE) or else the segment's own.  A region larger than the segment serves copy
 * syncs; WEX_SYNC_REMAP_FIXED needs it to fit the producer's allocation.
 * A call that fetches again (after wex_attach or a wexd restart) while regions show the
 * producer with no lease held (after wex_release) gives them private
 * memory back holding what they showed, and marks the weights dirty.
 * Errors: -ETIMEDOUT (no producer registered in time), -EINVAL (no such
 * producer rank or segment, size 0), -EPERM (not a consumer), -EAGAIN (a
 * lease is held but the segments are not known: sync first), wexd's error
 * fetching the segments, or the backend's error reserving the memory.
 */
WEX_API int wex_reserve(wex_client_t *c, uint32_t prank, uint32_t segment, uint64_t size,
			void **ptr);

struct wex_sync_result {
	uint64_t version;      /* the version now served */
	uint64_t bytes;        /* bytes copied (copy) or mapped (remap) */
	uint64_t ops;          /* copy operations executed (0 when a copy had
				* nothing to copy, changed 0, and for remaps) */
	double seconds;        /* wall time of the sync, waiting included */
	int changed;           /* 0 if the consumer already served this version */
	double waited;         /* of which waiting for the version to be published */
	/* Written only when the mode has WEX_SYNC_VERIFY (a program built
	 * before they existed never passes it, and is not written past its
	 * struct): */
	uint64_t verified;     /* bytes compared with the producer's */
	double verify_seconds; /* of `seconds`, the time the comparison took */
};

/*
 * Brings this consumer rank to the newest published version (at least
 * `min_version`), waiting up to `timeout_ms` (0: the client's timeout_ms if
 * set, else wexd's sync_timeout_ms) for one to be published.  All ranks of the consumer group get the same version.
 * COPY: leases the version for the length of the copy.  REMAP_*: leases it
 * until the next sync, wex_release or close (for the rollout's length).
 * min_version 0 means "the newest": a held lease is given up first, so the
 * producer may write.  A non-zero min_version not above the version this
 * rank holds keeps that lease and version (switching mode, e.g. view then
 * copy, without letting the producer in between).  A COPY sync first gives
 * same-address regions their private memory back, then copies into them.
 * GPU ordering: before the acquire, when a lease is held (its memory is
 * about to be given up) or for a COPY (the weights are about to change),
 * the call waits for this process's queued GPU work on the devices wex
 * uses and on the calling thread's context (cuCtxSynchronize: every
 * stream, the engine's kernels included), so no kernel still reads what
 * changes; a COPY returns once its copies completed.  A COPY of a host
 * segment into a layout in GPU memory runs on the GPU executor (host
 * staging) and, the first time, page-locks this process's read-only
 * mapping of the segment (cuMemHostRegister, once per import, kept until
 * the segment is unmapped) so the host-to-device copies run at link speed.
 * Where it cannot be pinned (a device that cannot pin read-only memory)
 * the sync fails naming why, before anything is copied (not dirty),
 * unless WEX_HOST_PIN=try is in the environment (the copies then run from
 * pageable memory, slower, with a warning in the log); WEX_HOST_PIN=0
 * never pins.  That first pin takes time in proportion to the segment's
 * size and runs under the lease, so it also delays the producer's next
 * wex_begin_write, once.  cuda_vmm producer memory is mapped read-only
 * where the driver allows it (else read-write, with a warning in the log;
 * legacy cuda_ipc opens are always read-write: CUDA IPC has no read-only
 * open, so that is no fallback and is not reported), and
 * reachable from the client's device (or the layout's) through peer
 * access when that is another GPU.  A sync that ran on such a weaker path
 * (pageable host staging, a read-write mapping, verification through
 * unpinned buffers) says so to wexd with its report, sent with the
 * client's next request: `wexctl clients` and `wexctl status` list it for
 * the client, and wex_sync_fallbacks_total counts it.
 * WEX_SYNC_VERIFY or'ed into COPY or REMAP_FIXED, or wexd's ask for
 * `wexctl verify` in any mode: before the lease ends (the producer's
 * begin_write waits for it), every byte the plan covers in the attached
 * layout is compared with the producer's memory; a difference fails the
 * sync with -WEX_EVERIFY, naming the first in the plan's order (tensor,
 * piece, byte) and how many bytes differ, and leaves the weights dirty.
 * VERIFY with REMAP_VIEW, or with REMAP_FIXED and no attached layout:
 * -EINVAL.  A view sync wexd asked to verify answers "unverifiable".
 * A sync that fails, whatever the error, leaves no same-address region
 * showing the producer without a lease: one that showed it gets private
 * memory back holding what it showed, and the weights are marked dirty
 * unless the lease that kept the producer out still stands (-ESHUTDOWN).
 * Blocks.  Errors: -ETIMEDOUT (the previous lease is given up; same-address
 * regions that showed its memory, or the producer's with no lease held
 * since wex_release, get private memory back holding what they showed,
 * which the producer may have begun to overwrite, so the weights are
 * marked dirty: sync again before serving; or, from a COPY,
 * the copy completed but wexd did not answer its release in time: the
 * weights hold the version whole and are not marked dirty, wex_is_dirty
 * tells the two apart),
 * -ESHUTDOWN (wexd is shutting down: the acquire is refused and a lease
 * held before it stays held, to use and release), -WEX_ELAYOUT (remap with
 * layouts that differ; or the attached layout asks for an element no
 * producer holds, which wexd's plan names: see wex_attach), -WEX_EDIRTY
 * when a copy was interrupted (the
 * weights are mixed; sync again before serving) or a same-address swap
 * failed after the region had lost its bytes (it holds fresh memory, or,
 * where even that could not be mapped, nothing: reads there fault until a
 * copy sync maps fresh memory, the message says which), -ESTALE when the
 * producer's memory behind the version went since it was acquired, or when
 * ranks of this group hold a version from a round lost that way (every
 * rank of the group must sync again; the message names the version),
 * -EFAULT when a COPY or a verified sync finds an attached tensor (outside
 * the client's own regions, and not one the driver did not know at attach:
 * host memory) where the CUDA driver knows an address range with nothing
 * mapped (wex_released; the one at the lowest address is named) (the
 * engine released that GPU memory and kept its addresses: vLLM's sleep
 * mode, torch_memory_saver's pause; a copy there would fault and lose
 * the process's CUDA context), checked before
 * anything is acquired (nothing copied, not dirty; wake the weights and
 * sync again; a verification wexd asked for is reported failed and the
 * sync goes on; memory released while the sync runs is not seen: the
 * copy faults there and the process's CUDA context is lost, so an engine
 * must not release its weights' memory until wex_sync returned, which
 * wex.engine.EngineRank.released() waits for, after a wex_cancel that
 * ends the sync's wait for a version),
 * -ECANCELED when wex_cancel ended its wait (see there), -EINTR when a
 * signal did (WEX_CLIENT_EINTR),
 * -ENOTRECOVERABLE when a GPU copy met a sticky CUDA error (illegal
 * address, launch failure, ...: the process's CUDA context is unusable,
 * its weights are dirty, and only a new process can sync again), -EAGAIN
 * when producers registered segments, or wexd restarted, during each of
 * several fetches of their memory (sync again once they stop), -EINVAL
 * for a min_version over 2^63-1 (JSON's largest integer), nothing sent.
 */
WEX_API int wex_sync(wex_client_t *c, int mode, uint64_t min_version, uint32_t timeout_ms,
		     struct wex_sync_result *res);

/*
 * Cancels the wex_sync or wex_begin_write (or wex_publish or a registration
 * call: see the end) running now on this client in another thread (or a signal
 * handler: it only reads two atomics and writes an eventfd): a wait of that
 * call for a version to be published (wex_sync's acquire) or for leases to end
 * (begin_write) ends at once, and the call returns -ECANCELED (with why in
 * wex_last_error), as after a timeout of that wait: a sync's previous lease is
 * given up, and same-address regions are handled as for -ETIMEDOUT; a
 * begin_write begins nothing.  A call cancelled before it sent that request
 * returns -ECANCELED without sending it (nothing acquired or begun; a lease
 * held stands).  A call whose wait already ended goes on: a sync that acquired
 * its version copies it whole and returns as usual (cancel is for waits, not
 * copies; nor are the GPU settle and the released-memory check before the
 * acquire cancelled).  A reconnect to a restarted wexd before that wait (the
 * call's request found the connection gone) is a wait too until wexd answers
 * its hello (a queue of connections that stays full, a hello unanswered: a
 * hung wexd), and ends there; once wexd answered, the reconnect goes on, and
 * the call's own wait is then cancelled as soon as it begins.  So is a
 * wex_begin_write's or wex_publish's wait for the producer's watch while it
 * reconnects: it ends at once, nothing of the call done.  It never blocks and
 * takes no lock, so it is safe while the call holds the client; c must stay
 * open until it returns.  wex_request refuses "cancel" (-EINVAL).  Returns 1
 * when such a call runs (it is cancelled), 0 when none does (nothing happens:
 * a later call is not cancelled), -EOPNOTSUPP when one runs but the wexd it
 * talks to predates cancels (not for wex_publish, which sends wexd no cancel;
 * a call that had not yet sent its request is cancelled; one already waiting
 * waits on), -ECHILD in a forked child's copy, -EINVAL for a NULL client.  A
 * wexd that does not answer the cancel within 3 s (stopped, deadlocked) has
 * the call's connection dropped, and the call returns -ECANCELED.  wex_publish
 * waits in wexd for nothing, so a cancel ends it only where wexd answers
 * nothing within those 3 s, or where no wexd answers (see wex_publish).  So
 * too for a registration call (wex_segment_alloc, wex_segment_register_fd and
 * _ptr, wex_register_tensors, wex_attach; 1 returned): its request goes to
 * wexd even when the cancel came before (it waits for nothing in wexd); one
 * that wexd does not answer within 3 s of the cancel has the connection
 * dropped, as at its timeout (wexd forgets what the client registered on it;
 * the next call reconnects and registers it all again), and returns
 * -ECANCELED, nothing of it kept (call it again; the parts of a chained
 * registration too); where wexd answers, it ends as usual.  A consumer's lease
 * goes with that connection: an attach so given up says so, and same-address
 * regions that showed the producer get private memory back (weights dirty).
 */
WEX_API int wex_cancel(wex_client_t *c);

/* Releases the remap lease taken by the last sync, after waiting for this
 * process's queued GPU work on the devices wex uses (kernels reading the
 * remapped weights must be done before the producer may write).  Blocks
 * for that wait and one round trip.  View pointers stay mapped but may
 * change under the reader.  A remap lease outlives a wexd restart: wexd
 * writes it down (its lease journal, beside the socket), the new wexd
 * holds the producer off, and the client's next call takes the lease back
 * (this release then ends it: 0).  -ENOENT when no lease is held;
 * -WEX_EDAEMON when the lease was lost before this call with wexd's
 * connection (a wexd restarted without its journal, or a call it did not
 * answer dropped the connection and wexd dropped the lease): the producer
 * may have written while this rank read its memory; or when no wexd could
 * be reached to give it back: a wexd started later holds the producer off
 * until this client's next call or wex_client_close (either ends it) or
 * exit.  The lease is gone from the client either way. */
WEX_API int wex_release(wex_client_t *c);

/* 1 if the consumer's weights are half-written (an interrupted copy, a
 * same-address sync that lost its lease: see wex_sync, or same-address
 * regions given private memory back holding what they showed when no
 * lease was known to keep the producer out: a wexd restart may have taken
 * the lease first, or none was held; or holding a newer version than the
 * attached tensors outside them, as a view sync's fetch after the
 * producers registered again leaves them), until a copy sync
 * completes, or a same-address sync does with every attached tensor in a
 * region (they all show its version then).
 * (Every call here returns -EINVAL for a NULL client or a NULL pointer it
 * needs, with the reason in wex_last_error when there is a client.) */
WEX_API int wex_is_dirty(wex_client_t *c);

/* 1 when [ptr, ptr + len) lies partly where the CUDA driver loaded in this
 * process knows a reserved address range with nothing mapped: GPU memory
 * an engine released while keeping its addresses (vLLM's sleep mode,
 * torch_memory_saver's pause), which a copy or a read would fault on;
 * *at (may be NULL) gets the first such address found.  0 otherwise
 * (mapped memory, host memory, no driver loaded in this process: nothing
 * is loaded to ask).  -EINVAL for a NULL ptr or a range past the end of
 * the address space.  wex_attach and wex_sync refuse such layouts
 * themselves (-EFAULT); this is for callers that read the memory first
 * (the engine hooks' checkpoint comparison).  "Nothing mapped": MAPPED 0
 * inside a range RANGE_START_ADDR/RANGE_SIZE report, or, where MAPPED has
 * no answer, no allocation there for cuMemGetAddressRange.  The answer
 * holds when it is given: a release just after is not seen.  Never waits
 * for GPU work; the calling thread's context is left as it was (a thread
 * with none borrows device 0's primary context for the queries, which
 * stays retained, as for wex's other pointer queries). */
WEX_API int wex_released(const void *ptr, uint64_t len, uint64_t *at);

/*
 * After a REMAP_VIEW sync: the address of producer rank `prank`'s piece of
 * canonical tensor `name`, as that rank registered it.  *desc (may be
 * NULL) receives its description (box, strides, offset), with ptr set.
 * Does not block.  -ENOENT when no such piece exists or nothing was
 * fetched yet (sync first), -EINVAL when name or ptr is NULL, -EPERM for a
 * client that is not a consumer.  The address
 * stays valid until a later sync fetches the producers' segments again
 * (they re-registered, a producer restarted or wexd did: ask again after
 * every sync) or the client is closed.
 */
WEX_API int wex_view(wex_client_t *c, uint32_t prank, const char *name, void **ptr,
		     struct wex_tensor *desc);

/* Producer rank `prank`'s tensor table as the last fetch received it (a
 * sync, or wex_reserve): *t points at its *n entries, owned by the client
 * and valid like wex_view's addresses.  Returns the number of producer
 * ranks.  -ENOENT when no such rank exists or nothing was fetched yet
 * (sync first; wex_attach drops what was fetched), -EPERM for a client
 * that is not a consumer.  Does not block. */
WEX_API int wex_producer_tensors(wex_client_t *c, uint32_t prank, const struct wex_tensor **t,
				 size_t *n);

/* ---------------------------------------------------------------------- */
/* Monitoring and administration.                                         */

/*
 * Sends one request {"op": op, ...args} to wexd and returns the reply as a
 * JSON string in *json (free with wex_free).  `args_json` may be NULL or a
 * JSON object whose members are merged into the request.  Blocks for one
 * round trip.  Returns the negated error code of a {"ok":false} reply.
 * A consumer holding a lease may not send "release", "acquire",
 * "attach", "fetch" or "hello" this way (-EINVAL): that would end the
 * lease behind libwex's back, while its views still show the producer's
 * memory.  "cancel" is refused too (call wex_cancel), and so is "fetch"
 * for every client (-EINVAL): its reply passes the producers' memory as
 * fds, which a JSON string cannot carry (wex_sync and wex_reserve fetch).
 */
WEX_API int wex_request(wex_client_t *c, const char *op, const char *args_json, char **json);

/* The last error message wexd or the library produced for this client
 * (never NULL; owned by the client; valid until the next call).  Every
 * call that acts (all but wex_is_dirty, wex_view, wex_producer_tensors,
 * wex_cancel, which runs beside the call it cancels, and this one) starts
 * with it empty: a failure never shows an earlier
 * call's message.  With c NULL: why the calling thread's last
 * wex_client_open failed ("" after one that succeeded). */
WEX_API const char *wex_last_error(wex_client_t *c);

/* ---------------------------------------------------------------------- */
/* Engine and trainer layouts (the model adaptation layer, DESIGN §5).     */

typedef struct wex_layout wex_layout_t;

/* One physical tensor of a layout's rank (what the engine or trainer
 * allocates under `name`): pieces [first, first + npieces) of the rank's
 * piece array are the canonical boxes it holds; bytes no piece covers are
 * padding (a padded vocabulary, say). */
struct wex_layout_tensor {
	char name[WEX_NAME_MAX];
	int32_t dtype;
	uint32_t ndim;
	uint64_t shape[WEX_MAX_DIMS];
	uint64_t nbytes;
	size_t first, npieces;
};

/*
 * Reads the model's config.json at `config` and the model family it names
 * (adapters/families, looked up in `adapters`, or with NULL in
 * $WEX_ADAPTERS, the source tree's adapters/, /usr/local/share/wex/adapters,
 * /usr/share/wex/adapters)
 * and parses `spec`, a layout as `wexctl plan` takes it ("vllm:tp=2",
 * "megatron:tp=8,pp=4", "sglang:tp=8,dp=8,dp_attention=1,ep=8", "fsdp:fsdp=8",
 * "hf").  *world (may be NULL) receives its number of ranks.  Blocks
 * (reads files).  Errors: -ENOENT (no such file or engine), -EINVAL (bad
 * JSON, unknown model type, bad spec), -WEX_ELAYOUT (a layout that cannot
 * exist, naming the number that does not fit), -ENOMEM; *err (when not
 * NULL) receives why, malloc'ed: free it with wex_free.
 */
WEX_API int wex_layout_open(const char *config, const char *spec, const char *adapters,
			    wex_layout_t **out, uint32_t *world, char **err);

/*
 * The physical tensors of `rank` (*phys, *nphys of them, in the layout's
 * order) and their pieces (*pieces, *npieces).  A piece is a struct
 * wex_tensor naming a canonical tensor, its dtype and whole shape, the box
 * of it held (start, extent), and where in its physical tensor: `segment`
 * is the physical tensor's index in *phys, `offset` bytes from its start,
 * `strides` its strides in elements (C order over its shape); ptr is NULL.
 * A consumer attaches the pieces with ptr = the physical tensor's address
 * + offset; a producer registers them with the segment and offset where
 * the physical tensor lies.  Owned by l, valid until the next call or
 * wex_layout_close.  Pure computation.  Errors: -EINVAL (rank past the
 * world, NULL arguments), -WEX_ELAYOUT, -ENOMEM; wex_layout_error says why.
 */
WEX_API int wex_layout_rank(wex_layout_t *l, uint32_t rank, const struct wex_layout_tensor **phys,
			    size_t *nphys, const struct wex_tensor **pieces, size_t *npieces);

/* Why the last wex_layout_rank failed ("" when it did not); owned by l.
 * A wex_layout_t is not thread-safe: calls on one handle must take turns
 * (Python's wex.Layout does); *out is NULL after a failed open. */
WEX_API const char *wex_layout_error(wex_layout_t *l);

WEX_API void wex_layout_close(wex_layout_t *l);

/* BEGIN cuda section (vmm/) */
/*
 * Exportable GPU memory for PyTorch trainers, with the signatures of
 * torch.cuda.memory.CUDAPluggableAllocator (alloc, free):
 *
 *   a = torch.cuda.memory.CUDAPluggableAllocator("libwex.so", "wex_cuda_alloc",
 *                                                "wex_cuda_free")
 *   pool = torch.cuda.MemPool(a.allocator())
 *   with torch.cuda.use_mem_pool(pool): model = build_model()
 *
 * Each call makes one CUDA VMM allocation (cuMemCreate with a POSIX fd
 * handle type, plus fabric where supported) on `device`, mapped read-write
 * for it, which wex can export without copies.  The zero-code alternative
 * is PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True (set the newer
 * PYTORCH_ALLOC_CONF too; alone it is ignored by torch 2.9.1), whose segments are
 * exportable too.  The CUDA driver is loaded at run time; without one
 * wex_cuda_alloc returns NULL (and logs why; wex_cuda_malloc says which
 * error).  `stream` is a cudaStream_t.
 * wex_cuda_alloc blocks briefly (driver calls); wex_cuda_free waits for
 * `stream` and the device's pending work before unmapping.
 */
#include <sys/types.h>
WEX_API void *wex_cuda_alloc(ssize_t size, int device, void *stream);
WEX_API void wex_cuda_free(void *ptr, ssize_t size, int device, void *stream);

/*
 * wex_cuda_alloc for callers that want the error: one allocation of `size`
 * bytes on `device`, its address in *ptr (written only on success), freed
 * with wex_cuda_free(*ptr, size, device, stream).  Returns 0, or
 * -WEX_ENOCUDA without a CUDA driver or device (or in a build without the
 * CUDA headers; the log says which), -EINVAL for size 0, -ENODEV for a
 * device that does not exist, -ENOMEM when the device is out of memory,
 * -EOPNOTSUPP when it cannot export VMM memory.  Blocks briefly (driver
 * calls).
 */
WEX_API int wex_cuda_malloc(size_t size, int device, void **ptr);
/* END cuda section */

#ifdef __cplusplus
}
#endif
#endif /* WEX_H */
