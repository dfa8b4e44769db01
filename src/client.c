#include "wex.h"
