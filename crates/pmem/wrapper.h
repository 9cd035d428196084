/* The one header the bindings are generated from (Debian: libpmem-dev). */
#include <libpmem.h>
