list(APPEND WEX_CORE_SOURCES vmm/host.c vmm/backend.c)
include(vmm/cuda.cmake OPTIONAL)
