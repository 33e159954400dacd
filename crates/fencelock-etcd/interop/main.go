// Command etcd-interop drives etcd's own lock and election recipes
// (go.etcd.io/etcd/client/v3/concurrency) for fencelock's interop tests
// (crates/fencelock-etcd/tests/it/etcd_layout_interop.rs). Each mode prints
// one line per event on stdout; "hold" and "campaign" wait for a line on
// stdin before they let go.
//
// A critical section is checked by etcd itself: entering puts the marker
// key only if no one is inside and the holder's token (its key's create
// revision) is above the last one admitted, in one Txn; fencelock's side
// of the test enters the same way. A refused entry is a violation.
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/client/v3/concurrency"
)

func main() {
	if err := run(); err != nil {
		fmt.Fprintln(os.Stderr, "etcd-interop:", err)
		os.Exit(1)
	}
}

func run() error {
	if len(os.Args) < 2 {
		return fmt.Errorf("usage: etcd-interop mutex|critical|hold|campaign|leader [flags]")
	}
	mode := os.Args[1]
	flags := flag.NewFlagSet(mode, flag.ContinueOnError)
	endpoints := flags.String("endpoints", "127.0.0.1:2379", "comma-separated etcd endpoints")
	name := flags.String("name", "", "lock or election name")
	rounds := flags.Int("rounds", 1, "mutex: lock cycles")
	marker := flags.String("marker", "", "critical sections: the marker key")
	last := flags.String("last", "", "critical sections: the last admitted token's key")
	who := flags.String("who", "go", "critical sections: this side's name")
	key := flags.String("key", "", "critical: the held lock's key (etcdctl lock's ETCD_LOCK_KEY)")
	ttl := flags.Int("ttl", 10, "session TTL in seconds")
	value := flags.String("value", "go", "campaign: the proposal")
	hold := flags.Duration("hold", 2*time.Millisecond, "time spent inside a critical section")
	if err := flags.Parse(os.Args[2:]); err != nil {
		return err
	}
	cli, err := clientv3.New(clientv3.Config{
		Endpoints:   strings.Split(*endpoints, ","),
		DialTimeout: 5 * time.Second,
	})
	if err != nil {
		return err
	}
	defer cli.Close()
	ctx := context.Background()
	section := critical{cli: cli, marker: *marker, last: *last, who: *who, hold: *hold}

	switch mode {
	case "mutex":
		for i := 0; i < *rounds; i++ {
			s, err := concurrency.NewSession(cli, concurrency.WithTTL(*ttl))
			if err != nil {
				return err
			}
			if i == 0 {
				// Connected: the other side may start its rounds.
				fmt.Println("READY")
			}
			m := concurrency.NewMutex(s, *name)
			if err := m.Lock(ctx); err != nil {
				return err
			}
			token, err := section.run(ctx, m.Key())
			if err != nil {
				return err
			}
			fmt.Printf("ROUND %d %d %d\n", i, token, m.Header().Revision)
			if err := m.Unlock(ctx); err != nil {
				return err
			}
			s.Close()
		}
	case "critical":
		if *key == "" {
			*key = os.Getenv("ETCD_LOCK_KEY")
		}
		token, err := section.run(ctx, *key)
		if err != nil {
			return err
		}
		fmt.Printf("CRITICAL %d\n", token)
	case "hold":
		s, err := concurrency.NewSession(cli, concurrency.WithTTL(*ttl))
		if err != nil {
			return err
		}
		defer s.Close()
		m := concurrency.NewMutex(s, *name)
		fmt.Println("WAITING")
		if err := m.Lock(ctx); err != nil {
			return err
		}
		token, err := createRevision(ctx, cli, m.Key())
		if err != nil {
			return err
		}
		fmt.Printf("LOCKED %s %d\n", m.Key(), token)
		waitLine()
		if err := m.Unlock(ctx); err != nil {
			return err
		}
		fmt.Println("UNLOCKED")
	case "campaign":
		s, err := concurrency.NewSession(cli, concurrency.WithTTL(*ttl))
		if err != nil {
			return err
		}
		defer s.Close()
		e := concurrency.NewElection(s, *name)
		fmt.Println("CAMPAIGNING")
		if err := e.Campaign(ctx, *value); err != nil {
			return err
		}
		fmt.Printf("LEADER %s %d\n", e.Key(), e.Rev())
		waitLine()
		if err := e.Resign(ctx); err != nil {
			return err
		}
		fmt.Println("RESIGNED")
	case "leader":
		s, err := concurrency.NewSession(cli, concurrency.WithTTL(*ttl))
		if err != nil {
			return err
		}
		defer s.Close()
		resp, err := concurrency.NewElection(s, *name).Leader(ctx)
		if err == concurrency.ErrElectionNoLeader {
			fmt.Println("NONE")
			return nil
		}
		if err != nil {
			return err
		}
		kv := resp.Kvs[0]
		fmt.Printf("LEADER %s %d %s\n", kv.Key, kv.CreateRevision, kv.Value)
	default:
		return fmt.Errorf("unknown mode %q", mode)
	}
	return nil
}

func waitLine() {
	bufio.NewReader(os.Stdin).ReadString('\n')
}

func createRevision(ctx context.Context, cli *clientv3.Client, key string) (int64, error) {
	resp, err := cli.Get(ctx, key)
	if err != nil {
		return 0, err
	}
	if len(resp.Kvs) == 0 {
		return 0, fmt.Errorf("the held key %q does not exist", key)
	}
	return resp.Kvs[0].CreateRevision, nil
}

type critical struct {
	cli          *clientv3.Client
	marker, last string
	who          string
	hold         time.Duration
}

// run enters the critical section with the create revision of the held
// key as token, stays for hold, and leaves; a refused entry is an error
// naming who was inside and the last token admitted.
func (c critical) run(ctx context.Context, key string) (int64, error) {
	token, err := createRevision(ctx, c.cli, key)
	if err != nil {
		return 0, err
	}
	padded := fmt.Sprintf("%020d", token)
	resp, err := c.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.CreateRevision(c.marker), "=", 0),
			clientv3.Compare(clientv3.Value(c.last), "<", padded)).
		Then(clientv3.OpPut(c.marker, c.who), clientv3.OpPut(c.last, padded)).
		Else(clientv3.OpGet(c.marker), clientv3.OpGet(c.last)).
		Commit()
	if err != nil {
		return 0, err
	}
	if !resp.Succeeded {
		inside, admitted := "", ""
		if kvs := resp.Responses[0].GetResponseRange().Kvs; len(kvs) > 0 {
			inside = string(kvs[0].Value)
		}
		if kvs := resp.Responses[1].GetResponseRange().Kvs; len(kvs) > 0 {
			admitted = string(kvs[0].Value)
		}
		return 0, fmt.Errorf("VIOLATION %s with token %d: inside %q, last admitted %q", c.who, token, inside, admitted)
	}
	time.Sleep(c.hold)
	_, err = c.cli.Txn(ctx).
		If(clientv3.Compare(clientv3.Value(c.marker), "=", c.who)).
		Then(clientv3.OpDelete(c.marker)).
		Commit()
	return token, err
}
