/* SPDX-License-Identifier: MIT */
/*
 * wexctl.c - the operator's command line: readable tables of what wexd
 * holds (status, models, clients, plans, a live watch), metrics and
 * configuration, plus the offline planner tools (plan, convert).
 * Every query command takes --json for scripts.
 */
#include <errno.h>
#include <jansson.h>
#include <locale.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <time.h>
#include <unistd.h>
#include <wchar.h>

#include "proto.h"
#include "wex.h"
#if __has_include("wexctl_plan.h")
#include "wexctl_plan.h"
#define WEXCTL_HAVE_PLAN 1
#endif

static const char *sock_path;

static void usage(FILE *f)
{
	fprintf(f,
		"usage: wexctl [--socket PATH] COMMAND [--json]\n"
		"commands:\n"
		"  status            daemon, models, versions, producers, consumers, leases\n"
		"  models            models with versions, state, bytes, producers\n"
		"  clients           connected clients (pid, uid, role, model, rank, lease, exit watched,\n"
		"                    fallbacks their syncs ran on)\n"
		"  plans             cached copy plans and their statistics\n"
		"  watch [-n SEC] [--count N]\n"
		"                    live view, refreshed in place (like top)\n"
		"  metrics           Prometheus text exposition\n"
		"  config get [NAME] | config set NAME VALUE\n"
		"  config reload     re-read wexd's configuration file (as SIGHUP), exit 1 if it is\n"
		"                    refused (the running configuration kept): systemd's ExecReload\n"
		"  verify MODEL [--group G] [--timeout SEC] [--no-wait]\n"
		"                    ask every engine rank of MODEL (or group G) to compare, on its\n"
		"                    next sync within SEC (60), each byte of its weights with the\n"
		"                    trainer's (under the sync's lease: the trainer's begin_write\n"
		"                    waits for it), and wait that long for the answers; exit 0 all\n"
		"                    equal, 3 a rank differs, 4 not every rank verified (no sync in\n"
		"                    time, a view sync, ...)\n"
		"  plan --config config.json --from LAYOUT --to LAYOUT [--rank K] [--json]\n"
		"       [--adapters DIR]    (plan --help: the LAYOUT syntax)\n"
		"  convert --config config.json --from LAYOUT --to LAYOUT [--max-shard-size SIZE]\n"
		"       [--progress auto|always|never] [--adapters DIR] IN OUTDIR\n"
		"                    (convert --help: what IN and OUTDIR hold)\n"
		"The socket defaults to $WEX_SOCKET, $XDG_RUNTIME_DIR/wex/wexd.sock, /run/wex/wexd.sock.\n"
		"Exit status: 0 done; 1 wexd cannot be reached or refused the request (its reason\n"
		"on stderr), or a plan or convert failed; 2 a bad command, option or value;\n"
		"verify also 3 and 4 (above).\n");
}

/* wexd answers an admin's every request at once: one that answers nothing
 * for ADMIN_TIMEOUT_MS plus libwex's 5 s margin (10 s) is hung, stopped
 * or overloaded, and is said so then, not after the 35 s a client waits
 * by default. */
#define ADMIN_TIMEOUT_MS 5000

/* Set while wexctl watch waits for wexd to come back: it said so once. */
static int admin_quiet;

static int open_admin(wex_client_t **c)
{
	struct wex_client_params p = {
		.field_mask = WEX_CLIENT_FIELD_ROLE | WEX_CLIENT_FIELD_TIMEOUT |
			      (sock_path ? WEX_CLIENT_FIELD_SOCKET : 0),
		.role = WEX_ROLE_ADMIN,
		.socket = sock_path,
		.timeout_ms = ADMIN_TIMEOUT_MS,
	};
	char buf[4096];
	const char *path, *why;
	struct stat st;
	size_t max = sizeof(((struct sockaddr_un *)0)->sun_path) - 1;
	int ret;

	/* ($WEX_SOCKET's: --socket's was refused already.)  Said as what it
	 * is, not as connect()'s "Invalid argument". */
	path = sock_path ? sock_path : wex__default_socket(buf, sizeof(buf));
	if (strlen(path) > max) {
		fprintf(stderr, "wexctl: cannot reach wexd at %s: the path is %zu bytes long, over "
			"the %zu a UNIX socket's path may have\n", path, strlen(path), max);
		return -ENAMETOOLONG;
	}
	ret = wex_client_open(&p, c);
	if (ret < 0) {
		const char *hint = "";

		why = wex_strerror(ret);
		/* Say what to do, not only what failed. */
		if ((ret == -ECONNREFUSED || ret == -ENOTSOCK) && stat(path, &st) == 0 &&
		    !S_ISSOCK(st.st_mode)) {
			/* connect() calls a directory or a plain file "refused":
			 * no wexd could ever listen there. */
			why = "not a socket";
			hint = "\n  name wexd's socket with --socket PATH or $WEX_SOCKET (the "
			       "systemd service's is /run/wex/wexd.sock)";
		} else if (ret == -ENOENT || ret == -ECONNREFUSED) {
			hint = "\n  is wexd running? Start it (systemctl start wexd.socket, or run "
			       "wexd), or name its socket with --socket PATH or $WEX_SOCKET (the "
			       "systemd service's is /run/wex/wexd.sock)";
		} else if (ret == -EACCES) {
			hint = "\n  this user may not connect: the socket's group (wex under "
			       "systemd) must include it (usermod -aG wex USER, then log in again)";
		} else if ((ret == -EBUSY || ret == -ESHUTDOWN || ret == -EMFILE) &&
			   *wex_last_error(NULL)) {
			/* wexd refused this client, and said why. */
			why = wex_last_error(NULL);
		} else if (ret == -WEX_EPROTO_VERSION) {
			/* Reached, and refused: wexd's words name both
			 * versions.  An upgrade installed while the old wexd
			 * runs (systemctl reload runs the new wexctl). */
			if (*wex_last_error(NULL))
				why = wex_last_error(NULL);
			hint = "\n  wexctl and the running wexd are of different releases: run the "
			       "wexctl installed with that wexd, or restart wexd to run the one "
			       "installed (systemctl restart wexd)";
		} else if (ret == -ETIMEDOUT) {
			hint = "\n  wexd took the connection but answered nothing for 10 s: it is "
			       "hung, stopped or overloaded; its log (journalctl -u wexd) and "
			       "systemctl status wexd say more";
		} else if (ret == -EAGAIN) {
			hint = "\n  wexd's queue of connections stayed full for 10 s: it accepts none "
			       "(hung, stopped or overloaded); its log (journalctl -u wexd) and "
			       "systemctl status wexd say more";
		} else if (ret == -EPIPE || ret == -ECONNRESET) {
			/* wexd accepted and closed the connection at once. */
			hint = "\n  wexd closed the connection at once: it refuses new clients while "
			       "max_clients are connected (or max_clients_per_uid of the user's), while "
			       "it drains after SIGTERM, and when it "
			       "is out of file descriptors; its log says which";
		}
		if (!admin_quiet)
			fprintf(stderr, "wexctl: cannot reach wexd at %s: %s%s\n", path, why, hint);
	}
	return ret;
}

static json_t *query(wex_client_t *c, const char *op, const char *args)
{
	char *s = NULL;
	json_t *j;
	int ret = wex_request(c, op, args, &s);

	if (ret < 0) {
		/* wexd's message names the command and what was wrong; the code's
		 * own text ("No such file or directory" for an unknown field)
		 * would only mislead beside it. */
		if (*wex_last_error(c))
			fprintf(stderr, "wexctl: %s\n", wex_last_error(c));
		else
			fprintf(stderr, "wexctl: %s: %s\n", op, wex_strerror(ret));
		return NULL;
	}
	j = json_loads(s, 0, NULL);
	wex_free(s);
	return j;
}

/* Columns a UTF-8 string takes on a terminal: one a character, two for
 * the wide scripts (CJK, Hangul, fullwidth forms), none for the marks
 * that combine with the character before them (a decomposed "é", as
 * macOS names files: e and U+0301; a decomposed "ガ": カ and U+3099;
 * Hebrew points, Arabic harakat, Thai vowel marks), the zero-width
 * characters and the variation selectors: glibc's wcwidth in C.UTF-8,
 * whatever the caller's locale.  Where that locale is missing (glibc
 * before 2.35 without it installed), the commonest ranges by hand. */
static int text_width(const char *s)
{
	static locale_t utf8;
	static int tried;
	const unsigned char *p = (const unsigned char *)s;
	int w = 0;

	if (!tried++)
		utf8 = newlocale(LC_CTYPE_MASK, "C.UTF-8", (locale_t)0);
	if (utf8) {
		locale_t old = uselocale(utf8);
		mbstate_t st = { 0 };
		size_t left = strlen(s), n;
		wchar_t wc;

		for (; left; s += n, left -= n) {
			n = mbrtowc(&wc, s, left, &st);
			if (n == (size_t)-1 || n == (size_t)-2) { /* not UTF-8: a column a byte */
				memset(&st, 0, sizeof(st));
				n = 1;
				w++;
				continue;
			}
			int cw = wcwidth(wc);

			w += cw < 0 ? 1 : cw; /* (unassigned or a control: one) */
		}
		uselocale(old);
		return w;
	}
	while (*p) {
		unsigned cp = *p, n = cp >= 0xf0 ? 3 : cp >= 0xe0 ? 2 : cp >= 0xc0 ? 1 : 0;

		cp &= n ? 0x3f >> n : 0xff;
		for (p++; n && (*p & 0xc0) == 0x80; n--, p++)
			cp = (cp << 6) | (*p & 0x3f);
		if ((cp >= 0x300 && cp <= 0x36f) || (cp >= 0x483 && cp <= 0x489) ||
		    (cp >= 0x1160 && cp <= 0x11ff) || (cp >= 0x1ab0 && cp <= 0x1aff) ||
		    (cp >= 0x1dc0 && cp <= 0x1dff) || (cp >= 0x200b && cp <= 0x200f) ||
		    (cp >= 0x2060 && cp <= 0x2064) || (cp >= 0x20d0 && cp <= 0x20ff) ||
		    (cp >= 0x302a && cp <= 0x302d) || (cp >= 0x3099 && cp <= 0x309a) ||
		    (cp >= 0xfe00 && cp <= 0xfe0f) || (cp >= 0xfe20 && cp <= 0xfe2f) ||
		    cp == 0xfeff || (cp >= 0xe0100 && cp <= 0xe01ef))
			continue;
		w += (cp >= 0x1100 && cp <= 0x115f) || (cp >= 0x2e80 && cp <= 0xa4cf) ||
		     (cp >= 0xac00 && cp <= 0xd7a3) || (cp >= 0xf900 && cp <= 0xfaff) ||
		     (cp >= 0xfe30 && cp <= 0xfe4f) || (cp >= 0xff00 && cp <= 0xff60) ||
		     (cp >= 0xffe0 && cp <= 0xffe6) || (cp >= 0x1f300 && cp <= 0x1faff) ||
		     (cp >= 0x20000 && cp <= 0x3fffd) ? 2 : 1;
	}
	return w;
}

/* s then spaces to fill width columns, for a table's name column: printf's
 * %-16s counts bytes, and left a UTF-8 name's row short of its header. */
static const char *pad(char *buf, size_t len, const char *s, int width)
{
	int n = width - text_width(s ? s : "");

	snprintf(buf, len, "%s%*s", s ? s : "", n > 0 ? n : 0, "");
	return buf;
}

static void fmt_bytes(uint64_t b, char *out, size_t len)
{
	const char *u[] = { "B", "KiB", "MiB", "GiB", "TiB" };
	double v = (double)b;
	int i = 0;

	while (v >= 1024 && i < 4) {
		v /= 1024;
		i++;
	}
	snprintf(out, len, i ? "%.1f %s" : "%.0f %s", v, u[i]);
}

static void print_daemon(json_t *d)
{
	const char *why = json_string_value(json_object_get(d, "io_fallback_reason"));
	const char *ew = json_string_value(json_object_get(d, "exit_watch"));
	json_t *fds = json_object_get(d, "fds");

	why = why ? why : "";
	printf("wexd pid %lld  up %.0f s  event loop %s%s%s%s  socket %s\n",
	       (long long)json_integer_value(json_object_get(d, "pid")),
	       json_real_value(json_object_get(d, "uptime_s")),
	       json_string_value(json_object_get(d, "io")), *why ? " (" : "", why, *why ? ")" : "",
	       json_string_value(json_object_get(d, "socket")));
	printf("config %s  clients %lld  fds %lld of %lld  client exits watched by %s%s\n",
	       json_string_value(json_object_get(d, "config")),
	       (long long)json_integer_value(json_object_get(d, "clients")),
	       (long long)json_integer_value(json_object_get(fds, "open")),
	       (long long)json_integer_value(json_object_get(fds, "limit")), ew ? ew : "?",
	       json_is_true(json_object_get(d, "draining")) ? "  DRAINING" : "");
	json_t *lj = json_object_get(d, "lease_journal");
	const char *dir = json_string_value(json_object_get(lj, "dir"));
	long long errs = json_integer_value(json_object_get(lj, "write_errors"));
	const char *nw = json_string_value(json_object_get(lj, "unwritable"));

	if (dir && nw)
		printf("lease journal %s  (cannot be written: %s; %lld failed writes: see the log)\n",
		       dir, nw, errs);
	else if (dir && errs)
		printf("lease journal %s  (%lld failed writes: see the log)\n", dir, errs);
	else if (dir)
		printf("lease journal %s\n", dir);
	else if (lj)
		printf("lease journal OFF: %s\n", json_string_value(json_object_get(lj, "off")));
}

static void print_models(json_t *models)
{
	size_t i, j;
	json_t *m, *x;

	printf("\n%-16s %-10s %9s %9s %6s %10s %5s\n", "MODEL", "STATE", "PUBLISHED", "WRITING",
	       "LEASES", "BYTES", "GEN");
	json_array_foreach(models, i, m) {
		char b[32], nb[WEX_NAME_MAX + 16];

		fmt_bytes((uint64_t)json_integer_value(json_object_get(m, "bytes")), b, sizeof(b));
		printf("%s %-10s %9lld %9lld %6lld %10s %5lld\n",
		       pad(nb, sizeof(nb), json_string_value(json_object_get(m, "name")), 16),
		       json_string_value(json_object_get(m, "state")),
		       (long long)json_integer_value(json_object_get(m, "published")),
		       (long long)json_integer_value(json_object_get(m, "writing")),
		       (long long)json_integer_value(json_object_get(m, "leases")), b,
		       (long long)json_integer_value(json_object_get(m, "layout_gen")));
	}
	json_array_foreach(models, i, m) {
		printf("\n%s producers:\n  %-5s %-8s %5s %8s %10s %9s %8s\n",
		       json_string_value(json_object_get(m, "name")), "RANK", "PID", "SEGS", "TENSORS",
		       "BYTES", "PUBLISHED", "WRITING");
		json_array_foreach(json_object_get(m, "producers"), j, x) {
			char b[32], tn[24];

			fmt_bytes((uint64_t)json_integer_value(json_object_get(x, "bytes")), b,
				  sizeof(b));
			/* "-": no table yet (0: an empty one, an FSDP rank past
			 * the last chunk of every parameter). */
			if (json_is_false(json_object_get(x, "registered")))
				snprintf(tn, sizeof(tn), "-");
			else
				snprintf(tn, sizeof(tn), "%lld",
					 (long long)json_integer_value(json_object_get(x, "tensors")));
			printf("  %-5lld %-8lld %5lld %8s %10s %9lld %8lld\n",
			       (long long)json_integer_value(json_object_get(x, "rank")),
			       (long long)json_integer_value(json_object_get(x, "pid")),
			       (long long)json_integer_value(json_object_get(x, "segments")), tn, b,
			       (long long)json_integer_value(json_object_get(x, "published")),
			       (long long)json_integer_value(json_object_get(x, "writing")));
		}
		if (json_integer_value(json_object_get(m, "producers_unlisted")))
			printf("  (%lld more rank(s) of %lld not connected, not listed)\n",
			       (long long)json_integer_value(json_object_get(m, "producers_unlisted")),
			       (long long)json_integer_value(json_object_get(m, "world")));
		json_array_foreach(json_object_get(m, "groups"), j, x) {
			long long world = json_integer_value(json_object_get(x, "world"));
			long long round = json_integer_value(json_object_get(x, "round"));
			char rounds[48];
			size_t k;
			json_t *r;

			if (round)
				snprintf(rounds, sizeof(rounds), "open round v%lld", round);
			else
				snprintf(rounds, sizeof(rounds), "no open round");
			printf("%s consumer group '%s' (%lld rank%s, %s):\n  %-5s %-8s %8s %-12s %7s\n",
			       json_string_value(json_object_get(m, "name")),
			       json_string_value(json_object_get(x, "name")), world, world == 1 ? "" : "s",
			       rounds, "RANK", "PID", "LEASE", "MODE", "SERVED");
			json_array_foreach(json_object_get(x, "ranks"), k, r) {
				long long pid = json_integer_value(json_object_get(r, "pid"));
				char pids[24];

				/* pid 0: no client holds the rank (it left). */
				if (pid)
					snprintf(pids, sizeof(pids), "%lld", pid);
				else
					snprintf(pids, sizeof(pids), "-");
				printf("  %-5lld %-8s %8lld %-12s %7lld\n",
				       (long long)json_integer_value(json_object_get(r, "rank")), pids,
				       (long long)json_integer_value(json_object_get(r, "lease")),
				       json_string_value(json_object_get(r, "mode")),
				       (long long)json_integer_value(json_object_get(r, "served")));
			}
			if (json_integer_value(json_object_get(x, "ranks_unlisted")))
				printf("  (%lld more rank(s) of %lld not connected, not listed)\n",
				       (long long)json_integer_value(json_object_get(x, "ranks_unlisted")),
				       world);
		}
		json_array_foreach(json_object_get(m, "held"), j, x) {
			char gb[WEX_NAME_MAX + 16];

			if (!j)
				printf("%s leases held from before this wexd started (until their process calls wexd, or exits):\n  %-10s %-5s %-8s %8s %-16s %8s\n",
				       json_string_value(json_object_get(m, "name")), "GROUP", "RANK",
				       "PID", "LEASE", "MODE", "SINCE(s)");
			printf("  %s %-5lld %-8lld %8lld %-16s %8.0f\n",
			       pad(gb, sizeof(gb), json_string_value(json_object_get(x, "group")), 10),
			       (long long)json_integer_value(json_object_get(x, "rank")),
			       (long long)json_integer_value(json_object_get(x, "pid")),
			       (long long)json_integer_value(json_object_get(x, "version")),
			       json_string_value(json_object_get(x, "mode")),
			       json_real_value(json_object_get(x, "since_s")));
		}
	}
}

static void print_clients(json_t *clients)
{
	size_t i;
	json_t *c;

	printf("\n%-4s %-8s %-6s %-9s %-14s %-10s %4s %6s %-12s %6s %9s %-7s %s\n", "ID", "PID",
	       "UID", "ROLE", "MODEL", "GROUP", "RANK", "LEASE", "MODE", "SYNCS", "LAST(s)", "WATCHED",
	       "WAITING");
	json_array_foreach(clients, i, c) {
		double ago = json_real_value(json_object_get(c, "last_sync_s_ago"));
		json_t *w = json_object_get(c, "exit_watched");
		char agos[32], mb[WEX_NAME_MAX + 16], gb[WEX_NAME_MAX + 16];

		if (ago < 0)
			snprintf(agos, sizeof(agos), "-");
		else
			snprintf(agos, sizeof(agos), "%.1f", ago);
		printf("%-4lld %-8lld %-6lld %-9s %s %s %4lld %6lld %-12s %6lld %9s %-7s %s\n",
		       (long long)json_integer_value(json_object_get(c, "id")),
		       (long long)json_integer_value(json_object_get(c, "pid")),
		       (long long)json_integer_value(json_object_get(c, "uid")),
		       json_string_value(json_object_get(c, "role")),
		       pad(mb, sizeof(mb), json_string_value(json_object_get(c, "model")), 14),
		       pad(gb, sizeof(gb), json_string_value(json_object_get(c, "group")), 10),
		       (long long)json_integer_value(json_object_get(c, "rank")),
		       (long long)json_integer_value(json_object_get(c, "lease")),
		       json_string_value(json_object_get(c, "mode")),
		       (long long)json_integer_value(json_object_get(c, "syncs")), agos,
		       !w ? "-" : json_is_true(w) ? "yes" : "no",
		       json_string_value(json_object_get(c, "waiting")));
	}
	/* Weaker paths a consumer's syncs ran on: said under the table. */
	json_array_foreach(clients, i, c) {
		json_t *fb = json_object_get(c, "fallbacks"), *v;
		size_t k;

		if (!json_array_size(fb))
			continue;
		printf("client %lld (pid %lld) ran syncs on a fallback:",
		       (long long)json_integer_value(json_object_get(c, "id")),
		       (long long)json_integer_value(json_object_get(c, "pid")));
		json_array_foreach(fb, k, v)
			printf(" %s", json_string_value(v) ?: "?");
		printf("\n");
	}
}

static void print_plans(json_t *plans)
{
	size_t i;
	json_t *p;

	printf("%-16s %4s %5s %5s %4s %8s %12s %12s %9s %5s %s\n", "MODEL", "GEN", "RANK", "WORLD",
	       "NEAR", "OPS", "NEEDED", "MOVED", "BUILD(ms)", "USES", "STATE");
	json_array_foreach(plans, i, p) {
		char n[32] = "-", m[32] = "-", ops[32] = "-", uses[32] = "-", mb[WEX_NAME_MAX + 16];
		const char *dev = json_string_value(json_object_get(p, "device"));
		/* The plan wexd's planner thread builds now: its time so far. */
		int building = json_is_true(json_object_get(p, "building"));
		double ms = building ? json_real_value(json_object_get(p, "building_s")) * 1e3 :
				       json_real_value(json_object_get(p, "build_ms"));
		char near[16] = "-";

		if (!building) {
			fmt_bytes((uint64_t)json_integer_value(json_object_get(p, "bytes_needed")), n,
				  sizeof(n));
			fmt_bytes((uint64_t)json_integer_value(json_object_get(p, "bytes_moved")), m,
				  sizeof(m));
			snprintf(ops, sizeof(ops), "%lld",
				 (long long)json_integer_value(json_object_get(p, "ops")));
			snprintf(uses, sizeof(uses), "%lld",
				 (long long)json_integer_value(json_object_get(p, "uses")));
		}
		/* NEAR: producer ranks on the consumer layout's GPU ("-":
		 * the layout is in host memory). */
		if (dev && dev[0])
			snprintf(near, sizeof(near), "%lld",
				 (long long)json_integer_value(json_object_get(p, "near_ranks")));
		printf("%s %4lld %5lld %5lld %4s %8s %12s %12s %9.2f %5s %s\n",
		       pad(mb, sizeof(mb), json_string_value(json_object_get(p, "model")), 16),
		       (long long)json_integer_value(json_object_get(p, "layout_gen")),
		       (long long)json_integer_value(json_object_get(p, "rank")),
		       (long long)json_integer_value(json_object_get(p, "world")), near, ops, n, m,
		       ms, uses,
		       building ? "building" :
		       json_is_true(json_object_get(p, "stale")) ? "stale" : "current");
	}
}

static int cmd_query(const char *op, int as_json)
{
	wex_client_t *c;
	json_t *j;
	int ret = open_admin(&c);

	if (ret < 0)
		return 1;
	j = query(c, op, NULL);
	wex_client_close(c);
	if (!j)
		return 1;
	if (as_json) {
		json_object_del(j, "ok");
		json_dumpf(j, stdout, JSON_INDENT(2));
		printf("\n");
	} else if (!strcmp(op, "status")) {
		print_daemon(json_object_get(j, "daemon"));
		print_models(json_object_get(j, "models"));
		print_clients(json_object_get(j, "clients"));
	} else if (!strcmp(op, "models")) {
		print_models(json_object_get(j, "models"));
	} else if (!strcmp(op, "clients")) {
		print_clients(json_object_get(j, "clients"));
	} else if (!strcmp(op, "plans")) {
		print_plans(json_object_get(j, "plans"));
	} else if (!strcmp(op, "metrics")) {
		fputs(json_string_value(json_object_get(j, "text")) ?: "", stdout);
	} else {
		json_object_del(j, "ok");
		json_dumpf(j, stdout, JSON_INDENT(2));
		printf("\n");
	}
	json_decref(j);
	return 0;
}

static int cmd_watch(double interval, int count)
{
	struct timespec ts = { .tv_sec = (time_t)interval,
			       .tv_nsec = (long)((interval - (double)(time_t)interval) * 1e9) };
	wex_client_t *c;
	int lost = 0; /* wexd stopped answering after the first view */

	/* A wexd not reached at first is an error (a wrong socket, say). */
	if (open_admin(&c) < 0)
		return 1;
	for (int i = 0; count <= 0 || i < count; i++) {
		json_t *j = NULL;

		/* One that stops answering later is waited for, as top rides
		 * through a restart: systemctl restart wexd, a crash that
		 * systemd restarts.  Said once on stderr; each try counts as
		 * a view; the reason (open_admin's or query's) is said once. */
		admin_quiet = lost;
		if (c || open_admin(&c) == 0)
			j = query(c, "status", NULL);
		if (!j) {
			wex_client_close(c);
			c = NULL;
			if (!lost) {
				fprintf(stderr, "wexctl: watch: wexd is not answering; trying again every "
					"%g s (Ctrl-C stops)\n", interval);
				lost = 1;
			}
		} else {
			if (lost)
				fprintf(stderr, "wexctl: watch: wexd answers again\n");
			lost = 0;
			/* Home the cursor and clear: the view refreshes in place. */
			if (isatty(STDOUT_FILENO))
				printf("\033[H\033[2J");
			print_daemon(json_object_get(j, "daemon"));
			print_models(json_object_get(j, "models"));
			print_clients(json_object_get(j, "clients"));
			fflush(stdout);
			json_decref(j);
		}
		if (count > 0 && i + 1 == count)
			break;
		nanosleep(&ts, NULL);
	}
	wex_client_close(c);
	/* Ended while wexd was not answering: the last view is not current. */
	return lost ? 1 : 0;
}

/* Prints the names in j's array key, comma-separated, or "none". */
static void print_names(json_t *j, const char *key)
{
	json_t *a = json_object_get(j, key), *v;
	size_t i;

	if (!json_array_size(a))
		printf("none");
	json_array_foreach(a, i, v)
		printf("%s%s", i ? ", " : "", json_string_value(v) ?: "?");
}

/* wexctl config reload: wexd re-reads its file and says what changed, or
 * refuses it (exit 1, wexd's reason on stderr), so that systemctl reload
 * fails where a refused file would otherwise pass unnoticed. */
static int config_reload(int as_json)
{
	wex_client_t *c;
	json_t *j;

	if (open_admin(&c) < 0)
		return 1;
	j = query(c, "config_reload", NULL);
	wex_client_close(c);
	if (!j)
		return 1;
	json_object_del(j, "ok");
	if (as_json) {
		json_dumpf(j, stdout, JSON_INDENT(2));
		printf("\n");
	} else {
		const char *file = json_string_value(json_object_get(j, "file"));

		printf("reloaded %s: changed: ", file && *file ? file : "(no file: defaults and environment)");
		print_names(j, "changed");
		printf("; needing a restart of wexd: ");
		print_names(j, "restart_needed");
		/* Said only when there are some (an older wexd has no list). */
		if (json_array_size(json_object_get(j, "overridden"))) {
			printf("; kept over the file (the environment, a flag or config set outranks it): ");
			print_names(j, "overridden");
		}
		if (json_array_size(json_object_get(j, "not_applied"))) {
			printf("; not applied, now or after a restart (systemd passes the socket: "
			       "set them in wexd.socket): ");
			print_names(j, "not_applied");
		}
		printf("\n");
	}
	json_decref(j);
	return 0;
}

static int bad_arg(const char *cmd, const char *what, const char *arg, const char *takes);

static int cmd_config(int argc, char **argv, int as_json)
{
	wex_client_t *c;
	json_t *args, *j;
	char *a;
	int ret;

	if (argc < 2 || (!strcmp(argv[1], "set") && argc < 4)) {
		fprintf(stderr, "usage: wexctl config get [NAME] | config set NAME VALUE | config reload\n");
		return 2;
	}
	/* The argument it does not take, named (README). */
	if (strcmp(argv[1], "get") && strcmp(argv[1], "set") && strcmp(argv[1], "reload"))
		return bad_arg("config", "unknown subcommand", argv[1], "get, set or reload");
	if (!strcmp(argv[1], "get") && argc > 3)
		return bad_arg("config get", "unexpected argument", argv[3], "takes one NAME at most");
	if (!strcmp(argv[1], "reload") && argc > 2)
		return bad_arg("config reload", "unexpected argument", argv[2], "takes only --json");
	if (!strcmp(argv[1], "reload"))
		return config_reload(as_json);
	if (!strcmp(argv[1], "get"))
		args = argc > 2 ? json_pack("{s:s}", "name", argv[2]) : json_object();
	else
		args = json_pack("{s:s, s:s}", "name", argv[2], "value", argv[3]);
	if (!args) {
		/* (A NULL here sent no name: "get" would have listed all.) */
		fprintf(stderr, "wexctl: config: NAME and VALUE must be UTF-8 text\n");
		return 2;
	}
	a = json_dumps(args, JSON_COMPACT);
	json_decref(args);
	if (open_admin(&c) < 0) {
		free(a);
		return 1;
	}
	j = query(c, !strcmp(argv[1], "get") ? "config_get" : "config_set", a);
	free(a);
	wex_client_close(c);
	if (!j)
		return 1;
	json_object_del(j, "ok");
	if (as_json || !json_object_get(j, "fields")) {
		json_dumpf(j, stdout, JSON_INDENT(2));
		printf("\n");
	} else {
		size_t i;
		json_t *f;

		/* RUNTIME as README's table: yes (config set), reload (a
		 * reload applies it), no (a restart). */
		printf("%-26s %-24s %-8s %-10s %s\n", "NAME", "VALUE", "SOURCE", "RUNTIME", "DOC");
		json_array_foreach(json_object_get(j, "fields"), i, f) {
			char *v = json_dumps(json_object_get(f, "value"), JSON_ENCODE_ANY | JSON_COMPACT);

			printf("%-26s %-24s %-8s %-10s %s\n",
			       json_string_value(json_object_get(f, "name")), v ? v : "",
			       json_string_value(json_object_get(f, "source")) ?: "",
			       json_is_true(json_object_get(f, "modifiable")) ? "yes"
			       : json_is_true(json_object_get(f, "reload")) ? "reload" : "no",
			       json_string_value(json_object_get(f, "doc")) ?: "");
			free(v);
		}
	}
	json_decref(j);
	ret = 0;
	return ret;
}

/* What a rank of wexctl verify's reply counts as: 0 equal, 1 differ, 2
 * still to answer (pending, absent), 3 anything else (not asked,
 * unverifiable, failed). */
static int verify_class(json_t *r)
{
	const char *st = json_string_value(json_object_get(r, "state")) ?: "";
	const char *res = json_string_value(json_object_get(json_object_get(r, "verify"), "result"));

	if (res && !strcmp(res, "equal"))
		return 0;
	if (res && !strcmp(res, "differ"))
		return 1;
	return !strcmp(st, "pending") || !strcmp(st, "absent") ? 2 : 3;
}

/* One rank's line of wexctl verify. */
static void print_verify_rank(const char *group, json_t *r)
{
	json_t *v = json_object_get(r, "verify");
	const char *state = json_string_value(json_object_get(r, "state")) ?: "?";
	const char *res = json_string_value(json_object_get(v, "result")) ?: "-";
	char bytes[32] = "-", detail[WEX_NAME_MAX + 512] = "";
	char secs[32] = "-", ver[32] = "-", gb[WEX_NAME_MAX + 16];

	if (v) {
		fmt_bytes((uint64_t)json_integer_value(json_object_get(v, "bytes")), bytes,
			  sizeof(bytes));
		snprintf(secs, sizeof(secs), "%.3f", json_real_value(json_object_get(v, "seconds")));
	}
	if (!strcmp(res, "differ"))
		snprintf(detail, sizeof(detail), "%lld bytes differ; the first in '%s' at byte %lld of this rank's piece",
			 (long long)json_integer_value(json_object_get(v, "differ_bytes")),
			 json_string_value(json_object_get(v, "tensor")) ?: "?",
			 (long long)json_integer_value(json_object_get(v, "offset")));
	else if (json_object_get(v, "why"))
		snprintf(detail, sizeof(detail), "%s", json_string_value(json_object_get(v, "why")));
	else if (json_is_true(json_object_get(r, "comparing")))
		snprintf(detail, sizeof(detail), "its sync of v%lld was asked and is comparing: no answer yet",
			 (long long)json_integer_value(json_object_get(r, "served")));
	else if (!strcmp(state, "pending"))
		snprintf(detail, sizeof(detail), "no sync since the ask (serves v%lld)",
			 (long long)json_integer_value(json_object_get(r, "served")));
	else if (!strcmp(state, "absent"))
		snprintf(detail, sizeof(detail), "no engine connected as this rank");
	else if (!strcmp(state, "not-asked"))
		snprintf(detail, sizeof(detail), "the group attached after the ask");
	else if (!strcmp(state, "expired"))
		snprintf(detail, sizeof(detail), "no sync while the ask stood (serves v%lld)",
			 (long long)json_integer_value(json_object_get(r, "served")));
	/* A rank that answered and then left: its answer, from its pid. */
	if (json_is_true(json_object_get(r, "gone"))) {
		size_t at = strlen(detail);

		snprintf(detail + at, sizeof(detail) - at, "%sits engine answered, then left",
			 at ? "; " : "");
	}
	/* VERSION: the version verified; "-" where nothing was (not 0,
	 * beside a detail naming the version served). */
	if (v)
		snprintf(ver, sizeof(ver), "%lld",
			 (long long)json_integer_value(json_object_get(v, "version")));
	printf("%s %-5lld %-8lld %-9s %-8s %-12s %-12s %10s %8s  %s\n", pad(gb, sizeof(gb), group, 16),
	       (long long)json_integer_value(json_object_get(r, "rank")),
	       (long long)json_integer_value(json_object_get(r, "pid")), state, ver,
	       json_string_value(json_object_get(v, "mode")) ?: "-", res, bytes, secs, detail);
}

/* Whether a rank of the reply has not answered yet: an absent rank of a
 * group the ask no longer stands for never will (and a model gone with
 * its clients is forgotten at the next poll, which would fail). */
static int verify_waiting(json_t *j)
{
	size_t i, k;
	json_t *g, *r;

	json_array_foreach(json_object_get(j, "groups"), i, g) {
		int over = json_is_false(json_object_get(g, "standing"));

		/* Ranks of a wide world wexd counts rather than lists: all
		 * absent (or not asked). */
		if (!over && json_integer_value(json_object_get(g, "ranks_unlisted")) > 0 &&
		    !strcmp(json_string_value(json_object_get(g, "unlisted_state")) ?: "", "absent"))
			return 1;
		json_array_foreach(json_object_get(g, "ranks"), k, r)
			if (verify_class(r) == 2 &&
			    !(over && !strcmp(json_string_value(json_object_get(r, "state")) ?: "",
					      "absent")))
				return 1;
	}
	return 0;
}

static int cmd_verify(const char *model, const char *group, double timeout, int wait, int as_json)
{
	struct timespec tick = { 0, 100 * 1000 * 1000 }, t0, now;
	wex_client_t *c;
	json_t *args, *j, *g, *r;
	char *a;
	int n[4] = { 0 };
	size_t i, k;

	/* The ask stands as long as this waits (--no-wait: as long as it
	 * would have): ranks that sync later are not asked. */
	args = json_pack("{s:s, s:I}", "model", model, "stand_ms",
			 (json_int_t)(timeout * 1e3 < 1 ? 1 : timeout * 1e3));
	if (args && group)
		json_object_set_new(args, "group", json_string(group));
	if (!args) {
		fprintf(stderr, "wexctl: verify: MODEL and GROUP must be UTF-8 text\n");
		return 2;
	}
	if (open_admin(&c) < 0) {
		json_decref(args);
		return 1;
	}
	a = json_dumps(args, JSON_COMPACT);
	j = query(c, "verify", a);
	free(a);
	if (!j) {
		json_decref(args);
		wex_client_close(c);
		return 1;
	}
	json_object_set(args, "ticket", json_object_get(j, "ticket"));
	json_object_del(args, "stand_ms");
	if (!as_json)
		printf("asked model '%s'%s%s%s to verify its next sync (ticket %lld, published v%lld)%s\n",
		       model, group ? " group '" : "", group ? group : "", group ? "'" : "",
		       (long long)json_integer_value(json_object_get(j, "ticket")),
		       (long long)json_integer_value(json_object_get(j, "published")),
		       wait ? "; waiting for every rank's answer" : "");
	fflush(stdout); /* before the wait: a log sees the ask at once */
	clock_gettime(CLOCK_MONOTONIC, &t0);
	while (wait && verify_waiting(j)) {
		clock_gettime(CLOCK_MONOTONIC, &now);
		if ((double)(now.tv_sec - t0.tv_sec) + (double)(now.tv_nsec - t0.tv_nsec) / 1e9 >=
		    timeout)
			break;
		nanosleep(&tick, NULL);
		a = json_dumps(args, JSON_COMPACT);
		json_decref(j);
		j = query(c, "verify", a);
		free(a);
		if (!j) {
			json_decref(args);
			wex_client_close(c);
			return 1;
		}
	}
	json_decref(args);
	wex_client_close(c);
	if (as_json) {
		json_object_del(j, "ok");
		json_dumpf(j, stdout, JSON_INDENT(2));
		printf("\n");
	} else {
		printf("%-16s %-5s %-8s %-9s %-8s %-12s %-12s %10s %8s  %s\n", "GROUP", "RANK", "PID",
		       "STATE", "VERSION", "MODE", "RESULT", "COMPARED", "SECONDS", "DETAIL");
	}
	json_array_foreach(json_object_get(j, "groups"), i, g) {
		json_int_t unl = json_integer_value(json_object_get(g, "ranks_unlisted"));
		const char *us = json_string_value(json_object_get(g, "unlisted_state")) ?: "absent";

		json_array_foreach(json_object_get(g, "ranks"), k, r) {
			n[verify_class(r)]++;
			if (!as_json)
				print_verify_rank(json_string_value(json_object_get(g, "name")) ?: "?", r);
		}
		/* Counted as the ranks they stand for would be (verify_class). */
		if (unl > 0) {
			n[!strcmp(us, "absent") ? 2 : 3] += (int)unl;
			if (!as_json)
				printf("%lld rank(s) of group '%s' %s, not listed (%s)\n", (long long)unl,
				       json_string_value(json_object_get(g, "name")) ?: "?", us,
				       !strcmp(us, "absent") ? "no engine connected as them" :
							       "the group attached after the ask");
		}
	}
	json_decref(j);
	if (!as_json) {
		if (n[1])
			printf("%d rank(s) hold weights that differ from the trainer's: they are marked dirty and must sync again (their engines got WEX_EVERIFY)\n",
			       n[1]);
		else if (n[2] || n[3])
			printf("%d rank(s) equal; %d not verified%s\n", n[0], n[2] + n[3],
			       !wait ? " yet (--no-wait: each rank's last result is in wexctl status --json)" :
			       " (see DETAIL: a rank verifies only when it syncs while the ask stands)");
		else
			printf("every rank's weights equal the trainer's, byte for byte (%d rank(s))\n",
			       n[0]);
	}
	return n[1] ? 3 : (n[2] || n[3]) ? 4 : 0;
}

/* Refuses what a command does not take: a typo (--jsn) must not pass as
 * the default. */
static int bad_arg(const char *cmd, const char *what, const char *arg, const char *takes)
{
	fprintf(stderr, "wexctl: %s: %s '%s' (%s)\n", cmd, what, arg, takes);
	return 2;
}

/* An option given last, without the value it takes. */
static int no_value(const char *cmd, const char *opt, const char *what)
{
	fprintf(stderr, "wexctl: %s%s%s needs a value (%s)\n", cmd, *cmd ? ": " : "", opt, what);
	return 2;
}

static int is_help(const char *a)
{
	return !strcmp(a, "-h") || !strcmp(a, "--help");
}

static int run(int argc, char **argv);

/* A command whose output could not be written (a full disk, a closed
 * pipe) fails, so that scripts writing a metrics file see it. */
int main(int argc, char **argv)
{
	int ret = run(argc, argv);

	if (fflush(stdout) == EOF || ferror(stdout)) {
		fprintf(stderr, "wexctl: writing the output: %s\n", strerror(errno));
		return ret ? ret : 1;
	}
	return ret;
}

static int run(int argc, char **argv)
{
	int as_json = 0, i = 1;
	const char *cmd;

	while (i < argc && argv[i][0] == '-') {
		if (!strcmp(argv[i], "--socket")) {
			if (i + 1 >= argc || !*argv[i + 1]) {
				fprintf(stderr, "wexctl: --socket needs a PATH (wexd's socket)\n");
				return 2;
			}
			/* Given twice is a slip (two commands pasted together),
			 * not an override: the last would ask another wexd. */
			if (sock_path) {
				fprintf(stderr, "wexctl: --socket given twice ('%s' and '%s')\n", sock_path,
					argv[i + 1]);
				return 2;
			}
			sock_path = argv[i + 1];
			/* connect() would say "Invalid argument" or "File name
			 * too long" of it: a bad value, named. */
			if (strlen(sock_path) >= sizeof(((struct sockaddr_un *)0)->sun_path)) {
				fprintf(stderr, "wexctl: --socket: the path is %zu bytes long, over the "
					"%zu a UNIX socket's path may have: %s\n", strlen(sock_path),
					sizeof(((struct sockaddr_un *)0)->sun_path) - 1, sock_path);
				return 2;
			}
			i += 2;
		} else if (!strcmp(argv[i], "--json")) {
			as_json = 1;
			i++;
		} else if (is_help(argv[i])) {
			usage(stdout);
			return 0;
		} else {
			fprintf(stderr, "wexctl: unknown option '%s'\n", argv[i]);
			usage(stderr);
			return 2;
		}
	}
	if (i >= argc) {
		usage(stderr);
		return 2;
	}
	cmd = argv[i];
#ifdef WEXCTL_HAVE_PLAN
	if (!strcmp(cmd, "plan") || !strcmp(cmd, "convert")) {
		/* A --json before the command is the command's (plan prints
		 * JSON; convert refuses it, as after the command). */
		static char json_opt[] = "--json";
		char **args = calloc((size_t)(argc - i + 2), sizeof(*args));
		int n = 1, ret;

		if (!args) {
			fprintf(stderr, "wexctl: out of memory\n");
			return 1;
		}
		/* Right after the command: never taken as an option's value. */
		args[0] = argv[i];
		if (as_json)
			args[n++] = json_opt;
		memcpy(args + n, argv + i + 1, (size_t)(argc - i - 1) * sizeof(*args));
		n += argc - i - 1;
		ret = !strcmp(cmd, "plan") ? wexctl_cmd_plan(n, args) : wexctl_cmd_convert(n, args);
		free(args);
		return ret;
	}
#endif
	if (!strcmp(cmd, "status") || !strcmp(cmd, "models") || !strcmp(cmd, "clients") ||
	    !strcmp(cmd, "plans") || !strcmp(cmd, "metrics")) {
		for (int k = i + 1; k < argc; k++) {
			if (is_help(argv[k])) {
				usage(stdout);
				return 0;
			}
			if (strcmp(argv[k], "--json"))
				return bad_arg(cmd, "unexpected argument", argv[k], "takes only --json");
			as_json = 1;
		}
		return cmd_query(cmd, as_json);
	}
	if (!strcmp(cmd, "watch")) {
		double interval = 1.0;
		long count = 0;
		int seen_n = 0, seen_count = 0;

		if (as_json) /* (refused after the command too) */
			return bad_arg(cmd, "unexpected argument", "--json",
				       "prints tables; takes -n SEC and --count N");
		for (int k = i + 1; k < argc; k++) {
			char *end = NULL;

			if (is_help(argv[k])) {
				usage(stdout);
				return 0;
			}
			if ((!strcmp(argv[k], "-n") || !strcmp(argv[k], "--count")) && k + 1 == argc)
				return no_value(cmd, argv[k], !strcmp(argv[k], "-n") ? "seconds" : "a count");
			/* Given twice: refused, not taken from the last (as plan's). */
			if ((!strcmp(argv[k], "-n") && seen_n++) ||
			    (!strcmp(argv[k], "--count") && seen_count++)) {
				fprintf(stderr, "wexctl: watch: %s given twice\n", argv[k]);
				return 2;
			}
			if (!strcmp(argv[k], "-n") && k + 1 < argc) {
				interval = strtod(argv[++k], &end);
				/* From 10 ms: -n 1e-9 asked wexd for its status with no
				 * pause, a core's worth of its loop. */
				if (end == argv[k] || *end || !(interval >= 0.01 && interval <= 86400))
					return bad_arg(cmd, "bad -n", argv[k], "seconds, 0.01 to 86400");
			} else if (!strcmp(argv[k], "--count") && k + 1 < argc) {
				count = strtol(argv[++k], &end, 10);
				/* Digits only: strtol's sign and blanks ("+2", " 2")
				 * are refused, as plan's --rank refuses them. */
				if (end == argv[k] || *end || argv[k][strspn(argv[k], "0123456789")] ||
				    count < 1 || count > 1000000000)
					return bad_arg(cmd, "bad --count", argv[k], "a whole number, 1 to 1000000000");
			} else {
				return bad_arg(cmd, "unexpected argument", argv[k], "takes -n SEC and --count N");
			}
		}
		return cmd_watch(interval, (int)count);
	}
	if (!strcmp(cmd, "config")) {
		int n = 0;
		char *args[4];

		for (int k = i; k < argc; k++) {
			if (!strcmp(argv[k], "--json")) {
				as_json = 1;
				continue;
			}
			if (is_help(argv[k])) {
				usage(stdout);
				return 0;
			}
			/* No field name starts with '-': a typo of an option
			 * (--jsn) is refused here rather than asked of wexd.
			 * A value may (config set NAME -1 gets wexd's reason). */
			if (argv[k][0] == '-' && !(n == 3 && !strcmp(args[1], "set"))) {
				char what[64];

				snprintf(what, sizeof(what), "config%s%s", n >= 2 ? " " : "",
					 n >= 2 ? args[1] : "");
				return bad_arg(what, "unknown option", argv[k], "takes --json");
			}
			/* A fifth word: set names it; get, reload and an
			 * unknown subcommand name their first extra word. */
			if (n == 4 && !strcmp(args[1], "set"))
				return bad_arg("config set", "unexpected argument", argv[k], "takes NAME VALUE");
			if (n == 4)
				return cmd_config(n, args, as_json);
			args[n++] = argv[k];
		}
		return cmd_config(n, args, as_json);
	}
	if (!strcmp(cmd, "verify")) {
		const char *model = NULL, *group = NULL;
		double timeout = 60;
		int wait = 1, seen_timeout = 0;

		for (int k = i + 1; k < argc; k++) {
			char *end = NULL;

			if (is_help(argv[k])) {
				usage(stdout);
				return 0;
			}
			if ((!strcmp(argv[k], "--group") || !strcmp(argv[k], "--timeout")) && k + 1 == argc)
				return no_value(cmd, argv[k], !strcmp(argv[k], "--group") ? "a consumer group" : "seconds");
			/* Given twice: refused, not taken from the last: a second
			 * --group would verify that group alone, and its exit 0
			 * say nothing of the first. */
			if (!strcmp(argv[k], "--group") && group) {
				fprintf(stderr, "wexctl: verify: --group given twice ('%s' and '%s'): one "
					"consumer group, or none for every group of the model\n", group,
					argv[k + 1]);
				return 2;
			}
			if (!strcmp(argv[k], "--timeout") && seen_timeout++) {
				fprintf(stderr, "wexctl: verify: --timeout given twice\n");
				return 2;
			}
			if (!strcmp(argv[k], "--group")) {
				group = argv[++k];
				if (!*group)
					return bad_arg(cmd, "empty --group", group, "a consumer group's name");
			} else if (!strcmp(argv[k], "--timeout")) {
				timeout = strtod(argv[++k], &end);
				if (end == argv[k] || *end || !(timeout >= 0 && timeout <= 86400))
					return bad_arg(cmd, "bad --timeout", argv[k], "seconds, 0 to 86400");
			} else if (!strcmp(argv[k], "--no-wait")) {
				wait = 0;
			} else if (!strcmp(argv[k], "--json")) {
				as_json = 1;
			} else if (argv[k][0] == '-') {
				return bad_arg(cmd, "unknown option", argv[k], "takes --group G, --timeout SEC, --no-wait, --json");
			} else if (model) {
				return bad_arg(cmd, "unexpected argument", argv[k], "takes one MODEL");
			} else {
				model = argv[k];
			}
		}
		if (!model || !*model) {
			fprintf(stderr, "wexctl: verify: name the MODEL (wexctl models lists them)\n");
			return 2;
		}
		return cmd_verify(model, group, timeout, wait, as_json);
	}
	fprintf(stderr, "wexctl: unknown command '%s'\n", cmd);
	usage(stderr);
	return 2;
}
