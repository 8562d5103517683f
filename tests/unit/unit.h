/* tests/unit/unit.h: what every unit test includes: cmocka with the headers it needs first, and
 * asserts cmocka lacks. Every assert here prints both values when it fails. */
#ifndef LLMGW_TESTS_UNIT_H
#define LLMGW_TESTS_UNIT_H

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>

#include <cmocka.h>

/* |a - b| <= eps for doubles (cmocka's assert_float_equal rounds to float). */
#define assert_double_near(a, b, eps)                                                            \
    do {                                                                                         \
        double a_ = (a), b_ = (b), e_ = (eps);                                                   \
        if (!(fabs(a_ - b_) <= e_)) {                                                            \
            print_error("%.17g != %.17g (within %g)\n", a_, b_, e_);                             \
            fail();                                                                              \
        }                                                                                        \
    } while (0)

/* `needle` occurs in `hay`. */
#define assert_contains(hay, needle)                                                             \
    do {                                                                                         \
        const char *h_ = (hay), *n_ = (needle);                                                  \
        if (h_ == NULL || strstr(h_, n_) == NULL) {                                              \
            print_error("\"%s\" does not contain \"%s\"\n", h_ ? h_ : "(null)", n_);             \
            fail();                                                                              \
        }                                                                                        \
    } while (0)

/* `s` starts with `prefix`. */
#define assert_prefix(s, prefix)                                                                 \
    do {                                                                                         \
        const char *s_ = (s), *p_ = (prefix);                                                    \
        if (s_ == NULL || strncmp(s_, p_, strlen(p_)) != 0) {                                    \
            print_error("\"%s\" does not start with \"%s\"\n", s_ ? s_ : "(null)", p_);          \
            fail();                                                                              \
        }                                                                                        \
    } while (0)

#endif
