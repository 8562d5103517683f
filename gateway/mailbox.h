/* gateway/mailbox.h: the one way results travel from worker threads (the encoder, the engine
 * schedulers) to the event loop. Any thread posts letters; the loop gets every letter posted
 * since its last call, oldest first, in one callback. A letter is a struct whose first member
 * is a gw_letter; it belongs to the mailbox from post until the callback hands it over.
 * post() never blocks on the loop and never allocates. */
#ifndef LLMGW_GATEWAY_MAILBOX_H
#define LLMGW_GATEWAY_MAILBOX_H

struct event_base;

typedef struct gw_letter {
    struct gw_letter *next;
} gw_letter;

/* On the loop thread: `first` and the letters linked after it are the callee's now. */
typedef void (*gw_mailbox_cb)(gw_letter *first, void *arg);

typedef struct gw_mailbox gw_mailbox;

/* NULL when libevent cannot make the wake event. */
gw_mailbox *gw_mailbox_new(struct event_base *base, gw_mailbox_cb cb, void *arg);
/* Frees the mailbox and returns the letters still queued (oldest first, the caller's now).
 * Call it when no thread can post any more. NULL gives NULL. */
gw_letter *gw_mailbox_free(gw_mailbox *m);
/* Any thread. */
void gw_mailbox_post(gw_mailbox *m, gw_letter *l);

#endif
