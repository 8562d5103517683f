/* gateway/dashboard.h: the dashboard page (gateway/dashboard.html), embedded in the binary at
 * build time by gateway/embed.cmake, served by GET /dashboard. */
#ifndef LLMGW_GATEWAY_DASHBOARD_H
#define LLMGW_GATEWAY_DASHBOARD_H

#include <stddef.h>

extern const char gw_dashboard_html[];   /* NUL-terminated */
extern const size_t gw_dashboard_html_len;

#endif
