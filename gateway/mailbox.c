/* gateway/mailbox.c: a mutex-guarded FIFO and a libevent wake event (see mailbox.h). */
#include "gateway/mailbox.h"

#include "common/arena.h"

#include <event2/event.h>
#include <pthread.h>
#include <stdlib.h>

struct gw_mailbox {
    pthread_mutex_t mu;
    gw_letter *head, *tail;    /* under mu */
    struct event *wake;
    gw_mailbox_cb cb;
    void *arg;
};

static gw_letter *take_all(gw_mailbox *m)
{
    pthread_mutex_lock(&m->mu);
    gw_letter *first = m->head;
    m->head = m->tail = NULL;
    pthread_mutex_unlock(&m->mu);
    return first;
}

static void on_wake(evutil_socket_t fd, short what, void *arg)
{
    (void)fd;
    (void)what;
    gw_mailbox *m = arg;
    gw_letter *first = take_all(m);
    if (first != NULL)
        m->cb(first, m->arg);
}

gw_mailbox *gw_mailbox_new(struct event_base *base, gw_mailbox_cb cb, void *arg)
{
    gw_mailbox *m = util_xcalloc(1, sizeof *m);
    m->cb = cb;
    m->arg = arg;
    m->wake = event_new(base, -1, 0, on_wake, m);
    if (m->wake == NULL) {
        free(m);
        return NULL;
    }
    pthread_mutex_init(&m->mu, NULL);
    return m;
}

gw_letter *gw_mailbox_free(gw_mailbox *m)
{
    if (m == NULL)
        return NULL;
    gw_letter *first = take_all(m);
    event_free(m->wake);
    pthread_mutex_destroy(&m->mu);
    free(m);
    return first;
}

void gw_mailbox_post(gw_mailbox *m, gw_letter *l)
{
    l->next = NULL;
    pthread_mutex_lock(&m->mu);
    if (m->tail != NULL)
        m->tail->next = l;
    else
        m->head = l;
    m->tail = l;
    pthread_mutex_unlock(&m->mu);
    /* Thread-safe (the base is made with threading on); several posts before the loop runs
     * wake it once. */
    event_active(m->wake, EV_READ, 0);
}
