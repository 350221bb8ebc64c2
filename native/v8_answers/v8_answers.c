/* Answers of mini-racer's V8 tasks, handed to the waiting thread without entering Python.
 *
 * mini-racer answers every task of a context through one callback, on the context's own V8
 * thread. This library's mg_answer is that callback: it files the answer under the task's
 * callback id (a channel) and posts the channel's semaphore, which the caller waits on in
 * mg_wait with the GIL released (ctypes releases it). See
 * magnetar/instance/javascript/_v8_context.py. */
#define _GNU_SOURCE /* sem_clockwait */
#include <errno.h>
#include <pthread.h>
#include <semaphore.h>
#include <stdint.h>
#include <time.h>

#define CHANNELS 256
/* Far above the callback ids mini-racer counts from 0, so no id of its own is mistaken. */
#define FIRST_ID 0x4d41474e00000000ULL

struct channel {
    sem_t answered;
    void *answer;
    int open;
};

static struct channel channels[CHANNELS];
static pthread_mutex_t opening = PTHREAD_MUTEX_INITIALIZER;

static struct channel *find(uint64_t id) {
    if (id < FIRST_ID || id - FIRST_ID >= CHANNELS) return 0;
    struct channel *channel = &channels[id - FIRST_ID];
    return channel->open ? channel : 0;
}

/* A free channel's callback id, or -1 when all are taken. */
int64_t mg_open(void) {
    int64_t id = -1;
    pthread_mutex_lock(&opening);
    for (int i = 0; i < CHANNELS; i++) {
        if (!channels[i].open) {
            sem_init(&channels[i].answered, 0, 0);
            channels[i].answer = 0;
            channels[i].open = 1;
            id = (int64_t)(FIRST_ID + (uint64_t)i);
            break;
        }
    }
    pthread_mutex_unlock(&opening);
    return id;
}

/* Only once the context is freed: no answer can come after. */
void mg_close(uint64_t id) {
    pthread_mutex_lock(&opening);
    struct channel *channel = find(id);
    if (channel) {
        sem_destroy(&channel->answered);
        channel->open = 0;
    }
    pthread_mutex_unlock(&opening);
}

/* The context's callback. A context has one task in flight, so one answer is filed at once;
 * an answer for no open channel is dropped (a context opened here sends only its own). */
void mg_answer(uint64_t id, void *value) {
    struct channel *channel = find(id);
    if (!channel) return;
    channel->answer = value;
    sem_post(&channel->answered);
}

/* The next answer on the channel, or NULL when none came within timeout_s. */
void *mg_wait(uint64_t id, double timeout_s) {
    struct channel *channel = find(id);
    if (!channel) return 0;
    struct timespec deadline;
    clock_gettime(CLOCK_MONOTONIC, &deadline);
    long long nanos = deadline.tv_nsec + (long long)(timeout_s * 1e9);
    deadline.tv_sec += (time_t)(nanos / 1000000000LL);
    deadline.tv_nsec = (long)(nanos % 1000000000LL);
    while (sem_clockwait(&channel->answered, CLOCK_MONOTONIC, &deadline) != 0) {
        if (errno != EINTR) return 0;
    }
    return channel->answer;
}
