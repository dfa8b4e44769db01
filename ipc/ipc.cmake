list(APPEND WEX_CORE_SOURCES ipc/sock.c)
