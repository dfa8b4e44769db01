# Core sources shared by libwex, wexd and wexctl.
list(APPEND WEX_CORE_SOURCES src/log.c src/util.c src/proto.c src/verify.c)
list(APPEND WEX_DAEMON_SOURCES src/wexd.c src/registry.c src/wexd_verify.c src/journal.c src/loop.c src/loop_epoll.c src/loop_uring.c)
list(APPEND WEX_CTL_SOURCES src/wexctl.c)
