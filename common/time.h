/* common/time.h: monotonic and wall clocks. */
#ifndef LLMGW_COMMON_TIME_H
#define LLMGW_COMMON_TIME_H

#include <stdint.h>

uint64_t util_now_ns(void);      /* CLOCK_MONOTONIC */
uint64_t util_wall_ms(void);     /* CLOCK_REALTIME, milliseconds since the epoch */

#endif
