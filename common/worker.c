/* common/worker.c: one thread, one queue (see worker.h). */
#include "common/worker.h"

#include "common/arena.h"
#include "common/thread.h"

#include <pthread.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

struct util_worker {
    pthread_t thread;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    util_job *head, *tail;
    bool stopping;
    char name[16];
};

static void *worker_main(void *arg)
{
    util_worker *w = arg;
    pthread_mutex_lock(&w->mu);
    for (;;) {
        while (w->head == NULL && !w->stopping)
            pthread_cond_wait(&w->cv, &w->mu);
        util_job *j = w->head;
        if (j == NULL)
            break;  /* stopping, and nothing left */
        w->head = j->next;
        if (w->head == NULL)
            w->tail = NULL;
        pthread_mutex_unlock(&w->mu);
        j->fn(j->arg);  /* j may be gone after this */
        pthread_mutex_lock(&w->mu);
    }
    pthread_mutex_unlock(&w->mu);
    return NULL;
}

int util_worker_start(util_worker **out, const char *name, util_err *err)
{
    util_worker *w = util_xcalloc(1, sizeof *w);
    snprintf(w->name, sizeof w->name, "%s", name ? name : "worker");
    pthread_mutex_init(&w->mu, NULL);
    pthread_cond_init(&w->cv, NULL);
    int rc = util_thread_start(&w->thread, w->name, worker_main, w, err);
    if (rc != 0) {
        pthread_cond_destroy(&w->cv);
        pthread_mutex_destroy(&w->mu);
        free(w);
        return rc;
    }
    *out = w;
    return 0;
}

void util_worker_stop(util_worker *w)
{
    if (w == NULL)
        return;
    pthread_mutex_lock(&w->mu);
    w->stopping = true;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
    util_thread_join(w->thread);
    pthread_cond_destroy(&w->cv);
    pthread_mutex_destroy(&w->mu);
    free(w);
}

void util_worker_post(util_worker *w, util_job *j)
{
    j->next = NULL;
    pthread_mutex_lock(&w->mu);
    if (w->tail != NULL)
        w->tail->next = j;
    else
        w->head = j;
    w->tail = j;
    pthread_cond_signal(&w->cv);
    pthread_mutex_unlock(&w->mu);
}
