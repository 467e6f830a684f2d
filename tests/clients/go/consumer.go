// A consumer written as a nats.go 1.22 user writes one. js mode: PullSubscribe bound
// to a durable, Fetch(batch, MaxWait(1s)) in a loop, Ack each message. core mode: a
// plain subscription. Any disconnect, reconnect or library error (other than a Fetch
// that found nothing before MaxWait) is counted and fails the run. Payloads are
// numbers 1..EXPECT; "p" is a probe (answered with PROBED on stdout, once).
// STALL_AT=N STALL_SECS=S (environment): a blocked downstream, the N-th message's
// handling (before its ack) blocks S seconds once, between STALLED and RESUMED on stdout.
//
// usage: consumer js URL STREAM CONSUMER EXPECT DEADLINE_SECS
//        consumer core URL SUBJECT - EXPECT DEADLINE_SECS
// prints: RESULT received=N dups=N errors=N disconnects=N max_gap_ms=N resume_unix_ms=N
package main

import (
	"errors"
	"fmt"
	"os"
	"strconv"
	"sync/atomic"
	"time"

	"github.com/nats-io/nats.go"
)

func main() {
	mode, url, stream, durable := os.Args[1], os.Args[2], os.Args[3], os.Args[4]
	expect, _ := strconv.Atoi(os.Args[5])
	secs, _ := strconv.Atoi(os.Args[6])
	var disconnects, errs int64
	nc, err := nats.Connect(url,
		nats.Name("go-"+durable),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			atomic.AddInt64(&disconnects, 1)
			fmt.Fprintf(os.Stderr, "ERROR disconnected: %v\n", err)
		}),
		nats.ReconnectHandler(func(_ *nats.Conn) {
			atomic.AddInt64(&disconnects, 1)
			fmt.Fprintln(os.Stderr, "ERROR reconnected")
		}),
		nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) {
			atomic.AddInt64(&errs, 1)
			fmt.Fprintf(os.Stderr, "ERROR async: %v\n", err)
		}),
	)
	if err != nil {
		fmt.Fprintf(os.Stderr, "ERROR connect: %v\n", err)
		os.Exit(2)
	}
	seen := map[int]bool{}
	dups := 0
	probed := false
	var maxGap time.Duration
	var resume time.Time
	last := time.Now()
	deadline := time.Now().Add(time.Duration(secs) * time.Second)
	firstReply := map[int]string{}
	stallAt, _ := strconv.Atoi(os.Getenv("STALL_AT"))
	stallSecs, _ := strconv.Atoi(os.Getenv("STALL_SECS"))
	stall := func() {
		if stallAt > 0 && len(seen) == stallAt {
			stallAt = 0
			fmt.Println("STALLED")
			time.Sleep(time.Duration(stallSecs) * time.Second)
			fmt.Println("RESUMED")
		}
	}
	record := func(data []byte, reply string) {
		if string(data) == "p" {
			if !probed {
				probed = true
				fmt.Println("PROBED")
			}
			return
		}
		now := time.Now()
		if gap := now.Sub(last); len(seen) > 0 && gap > maxGap {
			maxGap, resume = gap, now
		}
		last = now
		n, _ := strconv.Atoi(string(data))
		if seen[n] {
			dups++
			fmt.Fprintf(os.Stderr, "DUP %d first=%s again=%s\n", n, firstReply[n], reply)
		} else {
			firstReply[n] = reply
		}
		seen[n] = true
	}
	if mode == "core" {
		sub, err := nc.SubscribeSync(stream)
		if err == nil {
			err = nc.Flush()
		}
		if err != nil {
			fmt.Fprintf(os.Stderr, "ERROR subscribe: %v\n", err)
			os.Exit(2)
		}
		fmt.Println("READY")
		for len(seen) < expect && time.Now().Before(deadline) {
			m, err := sub.NextMsg(time.Second)
			if errors.Is(err, nats.ErrTimeout) {
				continue
			}
			if err != nil {
				errs++
				fmt.Fprintf(os.Stderr, "ERROR next: %v\n", err)
				continue
			}
			record(m.Data, m.Reply)
		}
	} else {
		js, err := nc.JetStream()
		if err != nil {
			fmt.Fprintf(os.Stderr, "ERROR jetstream: %v\n", err)
			os.Exit(2)
		}
		sub, err := js.PullSubscribe("", durable, nats.Bind(stream, durable))
		if err != nil {
			fmt.Fprintf(os.Stderr, "ERROR subscribe: %v\n", err)
			os.Exit(2)
		}
		fmt.Println("READY")
		for len(seen) < expect && time.Now().Before(deadline) {
			msgs, err := sub.Fetch(64, nats.MaxWait(time.Second))
			if err != nil && !errors.Is(err, nats.ErrTimeout) {
				errs++
				fmt.Fprintf(os.Stderr, "ERROR fetch: %v\n", err)
				continue
			}
			for _, m := range msgs {
				record(m.Data, m.Reply)
				stall()
				if err := m.Ack(); err != nil {
					errs++
					fmt.Fprintf(os.Stderr, "ERROR ack: %v\n", err)
				}
			}
		}
	}
	d := atomic.LoadInt64(&disconnects)
	fmt.Printf("RESULT received=%d dups=%d errors=%d disconnects=%d max_gap_ms=%d resume_unix_ms=%d\n",
		len(seen), dups, errs, d, maxGap.Milliseconds(), resume.UnixMilli())
	if len(seen) < expect || errs > 0 || d > 0 {
		os.Exit(1)
	}
}
