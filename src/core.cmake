# Core sources shared by libwex, wexd and wexctl.
list(APPEND WEX_CORE_SOURCES src/log.c src/util.c)
list(APPEND WEX_DAEMON_SOURCES src/wexd.c)
list(APPEND WEX_CTL_SOURCES src/wexctl.c)
