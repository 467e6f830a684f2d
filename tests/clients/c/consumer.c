/* A consumer written as a cnats 3.4 user writes one. js mode: js_PullSubscribe bound
 * to a durable, natsSubscription_Fetch(batch, 1 s) in a loop, natsMsg_Ack each
 * message. core mode: a synchronous subscription. Any disconnect, reconnect or library
 * error (other than a Fetch that found nothing in time) is counted and fails the run.
 * Payloads are numbers 1..EXPECT; "p" is a probe (answered with PROBED, once).
 * STALL_AT=N STALL_SECS=S (environment): a blocked downstream, the N-th message's
 * handling (before its ack) blocks S seconds once, between STALLED and RESUMED on stdout.
 *
 * usage: consumer js URL STREAM CONSUMER EXPECT DEADLINE_SECS
 *        consumer core URL SUBJECT - EXPECT DEADLINE_SECS
 * prints: RESULT received=N dups=N errors=N disconnects=N max_gap_ms=N resume_unix_ms=N */
#include <execinfo.h>
#include <nats/nats.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A crash (glibc's abort on heap corruption, a segfault) prints where it happened, so
 * that a CI log tells whether it was this program, the library, or what the library
 * was fed. */
static void on_fatal(int sig) {
    static const char head[] = "FATAL signal, backtrace:\n";
    void *frames[64];
    int n = backtrace(frames, 64);
    if (write(2, head, sizeof head - 1) < 0) {
    }
    backtrace_symbols_fd(frames, n, 2);
    signal(sig, SIG_DFL);
    raise(sig);
}

static volatile int disconnects = 0;
static volatile int async_errors = 0;

static void on_disconnect(natsConnection *nc, void *c) {
    (void)nc; (void)c;
    disconnects++;
    fprintf(stderr, "ERROR disconnected\n");
}

static void on_reconnect(natsConnection *nc, void *c) {
    (void)nc; (void)c;
    disconnects++;
    fprintf(stderr, "ERROR reconnected\n");
}

static void on_error(natsConnection *nc, natsSubscription *sub, natsStatus s, void *c) {
    (void)nc; (void)sub; (void)c;
    async_errors++;
    fprintf(stderr, "ERROR async: %s\n", natsStatus_GetText(s));
}

static int expect, received, dups, errors, probed;
static char *seen;
static char **first_reply;
static int64_t last, max_gap, resume;

static int stall_at, stall_secs;

/* The blocked downstream of STALL_AT / STALL_SECS, once. */
static void stall(void) {
    if (stall_at > 0 && received == stall_at) {
        stall_at = 0;
        printf("STALLED\n");
        fflush(stdout);
        nats_Sleep((int64_t)stall_secs * 1000);
        printf("RESUMED\n");
        fflush(stdout);
    }
}

static void record(natsMsg *m) {
    char buf[32] = {0};
    int len = natsMsg_GetDataLength(m);
    memcpy(buf, natsMsg_GetData(m), len < 31 ? len : 31);
    if (strcmp(buf, "p") == 0) {
        if (!probed) {
            probed = 1;
            printf("PROBED\n");
            fflush(stdout);
        }
        return;
    }
    int64_t now = nats_Now();
    if (received > 0 && now - last > max_gap) {
        max_gap = now - last;
        resume = now;
    }
    last = now;
    int n = atoi(buf);
    if (n >= 1 && n <= expect) {
        const char *reply = natsMsg_GetReply(m) ? natsMsg_GetReply(m) : "";
        if (seen[n]) {
            dups++;
            fprintf(stderr, "DUP %d first=%s again=%s\n", n, first_reply[n] ? first_reply[n] : "", reply);
        } else {
            first_reply[n] = strdup(reply);
            received++;
        }
        seen[n] = 1;
    }
}

int main(int argc, char **argv) {
    if (argc != 7) {
        fprintf(stderr, "usage: consumer js|core URL STREAM|SUBJECT CONSUMER|- EXPECT DEADLINE_SECS\n");
        return 2;
    }
    signal(SIGABRT, on_fatal);
    signal(SIGSEGV, on_fatal);
    signal(SIGBUS, on_fatal);
    int core = strcmp(argv[1], "core") == 0;
    const char *url = argv[2], *stream = argv[3], *durable = argv[4];
    expect = atoi(argv[5]);
    int64_t deadline = nats_Now() + (int64_t)atoi(argv[6]) * 1000;
    natsOptions *opts = NULL;
    natsConnection *nc = NULL;
    jsCtx *js = NULL;
    natsSubscription *sub = NULL;
    jsSubOptions so;
    jsErrCode jerr = 0;
    natsStatus s = natsOptions_Create(&opts);
    if (s == NATS_OK) s = natsOptions_SetURL(opts, url);
    if (s == NATS_OK) s = natsOptions_SetName(opts, durable);
    if (s == NATS_OK) s = natsOptions_SetDisconnectedCB(opts, on_disconnect, NULL);
    if (s == NATS_OK) s = natsOptions_SetReconnectedCB(opts, on_reconnect, NULL);
    if (s == NATS_OK) s = natsOptions_SetErrorHandler(opts, on_error, NULL);
    if (s == NATS_OK) s = natsConnection_Connect(&nc, opts);
    if (core) {
        if (s == NATS_OK) s = natsConnection_SubscribeSync(&sub, nc, stream);
        if (s == NATS_OK) s = natsConnection_Flush(nc);
    } else {
        if (s == NATS_OK) s = natsConnection_JetStream(&js, nc, NULL);
        if (s == NATS_OK) s = jsSubOptions_Init(&so);
        if (s == NATS_OK) {
            so.Stream = stream;
            so.Consumer = durable;
            s = js_PullSubscribe(&sub, js, "", durable, NULL, &so, &jerr);
        }
    }
    if (s != NATS_OK) {
        fprintf(stderr, "ERROR setup: %s (%d)\n", natsStatus_GetText(s), (int)jerr);
        return 2;
    }
    printf("READY\n");
    fflush(stdout);
    stall_at = getenv("STALL_AT") ? atoi(getenv("STALL_AT")) : 0;
    stall_secs = getenv("STALL_SECS") ? atoi(getenv("STALL_SECS")) : 0;
    seen = calloc((size_t)expect + 1, 1);
    first_reply = calloc((size_t)expect + 1, sizeof(char *));
    last = nats_Now();
    while (received < expect && nats_Now() < deadline) {
        if (core) {
            natsMsg *m = NULL;
            s = natsSubscription_NextMsg(&m, sub, 1000);
            if (s == NATS_TIMEOUT)
                continue;
            if (s != NATS_OK) {
                errors++;
                fprintf(stderr, "ERROR next: %s\n", natsStatus_GetText(s));
                continue;
            }
            record(m);
            natsMsg_Destroy(m);
            continue;
        }
        natsMsgList list = {0};
        s = natsSubscription_Fetch(&list, sub, 64, 1000, &jerr);
        if (s != NATS_OK && s != NATS_TIMEOUT) {
            errors++;
            fprintf(stderr, "ERROR fetch: %s (%d) %s\n", natsStatus_GetText(s), (int)jerr,
                    nats_GetLastError(NULL) ? nats_GetLastError(NULL) : "");
        }
        for (int i = 0; i < list.Count; i++) {
            record(list.Msgs[i]);
            stall();
            if (natsMsg_Ack(list.Msgs[i], NULL) != NATS_OK) {
                errors++;
                fprintf(stderr, "ERROR ack\n");
            }
        }
        natsMsgList_Destroy(&list);
    }
    errors += async_errors;
    printf("RESULT received=%d dups=%d errors=%d disconnects=%d max_gap_ms=%lld resume_unix_ms=%lld\n",
           received, dups, errors, disconnects, (long long)max_gap, (long long)resume);
    fflush(stdout);
    return (received < expect || errors > 0 || disconnects > 0) ? 1 : 0;
}
