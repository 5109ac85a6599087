// jetstream-bench: the NATS JetStream side of `tether-bench reliable`, built by
// Benchmarks/setup-jetstream from Debian's nats.go (golang-github-nats-io-go-nats-dev).
//
// Two modes, each a process of its own, as alice and bob are for Tether:
//
//	jetstream-bench consume -url nats://127.0.0.1:4222 -messages 100000
//	    creates the stream BENCH (subjects bench.>, file storage) and the durable push
//	    consumer "bob" (explicit acks), prints "ready", acknowledges every message, then
//	    prints "received N AT CPU DUPLICATES" (N distinct messages; AT: seconds since 1970 of
//	    the last one; CPU: this process's user + system seconds; DUPLICATES: copies received
//	    again, which a publish sent again after a lost acknowledgement can make).
//	jetstream-bench publish -url ... -messages 100000 -senders 64 -body 32 [-await]
//	    publishes from `senders` goroutines, each to a subject of its own (bench.<i>):
//	    asynchronously (at most 256 unacknowledged per sender), or with -await each publish
//	    waits for the stream's acknowledgement; prints "published N SECONDS CPU" once the
//	    stream has acknowledged every message. Each body starts with the message's number.
package main

import (
	"encoding/binary"
	"flag"
	"fmt"
	"os"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/nats-io/nats.go"
)

func cpuSeconds() float64 {
	var usage syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &usage); err != nil {
		return 0
	}
	seconds := func(t syscall.Timeval) float64 { return float64(t.Sec) + float64(t.Usec)/1e6 }
	return seconds(usage.Utime) + seconds(usage.Stime)
}

func fail(format string, arguments ...interface{}) {
	fmt.Fprintf(os.Stderr, "jetstream-bench: "+format+"\n", arguments...)
	os.Exit(1)
}

func connect(url string) (*nats.Conn, nats.JetStreamContext) {
	connection, err := nats.Connect(url, nats.Name("tether-bench"))
	if err != nil {
		fail("connect to %s: %v", url, err)
	}
	js, err := connection.JetStream(nats.PublishAsyncMaxPending(1 << 16))
	if err != nil {
		fail("JetStream: %v", err)
	}
	return connection, js
}

func consume(url string, messages int) {
	connection, js := connect(url)
	defer connection.Close()
	if _, err := js.AddStream(&nats.StreamConfig{Name: "BENCH", Subjects: []string{"bench.>"}, Storage: nats.FileStorage}); err != nil {
		fail("create the stream: %v", err)
	}
	// A durable push consumer with explicit acknowledgements, delivered into a channel.
	delivered := make(chan *nats.Msg, 1<<16)
	subscription, err := js.ChanSubscribe("bench.>", delivered, nats.Durable("bob"), nats.BindStream("BENCH"),
		nats.AckExplicit(), nats.MaxAckPending(1<<16), nats.DeliverAll())
	if err != nil {
		fail("create the consumer: %v", err)
	}
	defer subscription.Unsubscribe()
	fmt.Println("ready")
	start := cpuSeconds()
	received, duplicates := 0, 0
	seen := make(map[uint64]struct{}, messages)
	timeout := time.After(300 * time.Second)
	for received < messages {
		select {
		case message := <-delivered:
			if err := message.Ack(); err != nil {
				fail("ack: %v", err)
			}
			if len(message.Data) < 8 {
				fail("a message of %d bytes, without its number", len(message.Data))
			}
			number := binary.BigEndian.Uint64(message.Data)
			if _, duplicate := seen[number]; duplicate {
				duplicates++
				continue
			}
			seen[number] = struct{}{}
			received++
		case <-timeout:
			messages = received // gives up; the line below says how many arrived
		}
	}
	at := float64(time.Now().UnixNano()) / 1e9
	if err := connection.Flush(); err != nil {
		fail("flush the acknowledgements: %v", err)
	}
	fmt.Printf("received %d %.6f %.3f %d\n", received, at, cpuSeconds()-start, duplicates)
}

func publish(url string, messages, senders, bodySize int, await bool) {
	connection, js := connect(url)
	defer connection.Close()
	// Each body starts with its message's number (sender << 32 | index), for the consumer.
	stamped := func(sender, index int) []byte {
		body := make([]byte, bodySize)
		for position := range body {
			body[position] = 'm'
		}
		binary.BigEndian.PutUint64(body, uint64(sender)<<32|uint64(index))
		return body
	}
	var failures, republished int64
	start, cpu := time.Now(), cpuSeconds()
	var group sync.WaitGroup
	for sender := 0; sender < senders; sender++ {
		share := messages / senders
		if sender < messages%senders {
			share++
		}
		group.Add(1)
		go func(sender int, subject string, share int) {
			defer group.Done()
			if await {
				for index := 0; index < share; index++ {
					if _, err := js.Publish(subject, stamped(sender, index)); err != nil {
						atomic.AddInt64(&failures, 1)
					}
				}
				return
			}
			// At most 256 unacknowledged messages per sender: a window, as Tether's outbox.
			window := make(chan nats.PubAckFuture, 256)
			// nats.go 1.22 never resolves the future of a publish whose acknowledgement is
			// lost (a busy server can drop it): after 5 s it is published again, awaited. The
			// consumer counts each message once (a message id in a header would let the stream
			// drop the copy, but it halves JetStream's throughput here).
			settle := func(future nats.PubAckFuture) {
				select {
				case <-future.Ok():
					return
				case <-future.Err():
				case <-time.After(5 * time.Second):
				}
				for attempt := 0; attempt < 5; attempt++ {
					if _, err := js.PublishMsg(future.Msg()); err == nil {
						atomic.AddInt64(&republished, 1)
						return
					}
				}
				atomic.AddInt64(&failures, 1)
			}
			for index := 0; index < share; index++ {
				if len(window) == cap(window) {
					settle(<-window)
				}
				future, err := js.PublishAsync(subject, stamped(sender, index))
				if err != nil {
					atomic.AddInt64(&failures, 1)
					continue
				}
				window <- future
			}
			for len(window) > 0 {
				settle(<-window)
			}
		}(sender, fmt.Sprintf("bench.%d", sender), share)
	}
	group.Wait()
	if failures > 0 {
		fail("%d of %d publishes failed", failures, messages)
	}
	if republished > 0 {
		fmt.Fprintf(os.Stderr, "jetstream-bench: %d publishes were sent again after their acknowledgement did not come\n", republished)
	}
	fmt.Printf("published %d %.6f %.3f\n", messages, time.Since(start).Seconds(), cpuSeconds()-cpu)
}

func main() {
	if len(os.Args) < 2 {
		fail("usage: jetstream-bench consume|publish [flags]")
	}
	flags := flag.NewFlagSet(os.Args[1], flag.ExitOnError)
	url := flags.String("url", "nats://127.0.0.1:4222", "the NATS server")
	messages := flags.Int("messages", 100000, "messages in all")
	senders := flags.Int("senders", 64, "publishing goroutines, each to a subject of its own")
	bodySize := flags.Int("body", 32, "message body size in bytes (at least 8: the message's number)")
	await := flags.Bool("await", false, "each publish waits for the stream's acknowledgement")
	flags.Parse(os.Args[2:])
	if *bodySize < 8 {
		fail("-body must be at least 8 bytes (each body starts with its message's number)")
	}
	switch os.Args[1] {
	case "consume":
		consume(*url, *messages)
	case "publish":
		publish(*url, *messages, *senders, *bodySize, *await)
	default:
		fail("unknown mode %q: consume or publish", os.Args[1])
	}
}
