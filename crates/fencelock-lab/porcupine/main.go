// Command porcupine-check is the outside checker of `fencelock torture`
// histories (`fencelock torture --history FILE`): it checks them for
// linearizability with Porcupine against two sequential specifications
// written here, independently of the torture checker (Rust, in
// crates/fencelock-lab/src/torture/checker.rs), and fails when the two
// disagree.
//
//   - The fenced register, per fenced counter: a fence floor and a value.
//     An admit of token T succeeds iff T >= floor (the floor becomes T); a
//     read returns the value; a write of read+1 under token T is admitted iff
//     T >= floor and the value is still the one read (the floor becomes T,
//     the value read+1), and refused iff T < floor. An unfenced store admits
//     every write, so its stale writes and lost updates make the history
//     non-linearizable.
//   - The token sequence, per fenced resource: a grant of token T is legal
//     iff T is above every token granted before it (I2).
//   - The mutex of holds, per resource: each exclusive grant acquires it at
//     some instant between its request and its answer and releases it when
//     its trusted interval ended (the first of release called, loss noticed
//     and the guard's own deadline). An acquire is legal iff nobody holds
//     it, so two trusted intervals that must overlap leave no legal order,
//     whatever their tokens (I1 with I5).
//
// Usage:
//
//	go run . [-expect-violations] HISTORY.json...
//
// Exit status: 0 when Porcupine agrees with the torture checker on every
// file (and, with -expect-violations, found a violation in each), 1 on a
// disagreement or a missing violation, 2 on bad input or a check that did
// not finish in time.
package main

import (
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"time"

	"github.com/anishathalye/porcupine"
)

// history is the file `fencelock torture --history` writes.
type history struct {
	Workload                  string       `json:"workload"`
	Unfenced                  bool         `json:"unfenced"`
	CheckerRegisterViolations uint64       `json:"checker_register_violations"`
	CheckerTokenViolations    uint64       `json:"checker_token_violations"`
	CheckerHoldOverlaps       uint64       `json:"checker_hold_overlaps"`
	Register                  []registerOp `json:"register"`
	Grants                    []grantOp    `json:"grants"`
	Holds                     []holdOp     `json:"holds"`
}

type registerOp struct {
	Resource string `json:"resource"`
	Client   int    `json:"client"`
	Op       string `json:"op"`
	Token    uint64 `json:"token"`
	Value    int64  `json:"value"`
	Admitted bool   `json:"admitted"`
	Call     int64  `json:"call"`
	Ret      int64  `json:"ret"`
}

type grantOp struct {
	Resource string `json:"resource"`
	Client   int    `json:"client"`
	Token    uint64 `json:"token"`
	Call     int64  `json:"call"`
	Ret      int64  `json:"ret"`
}

type holdOp struct {
	Resource string `json:"resource"`
	Client   int    `json:"client"`
	Token    uint64 `json:"token"`
	Call     int64  `json:"call"`
	Ret      int64  `json:"ret"`
	End      int64  `json:"end"`
}

// register is the state of one fenced counter.
type register struct {
	floor uint64
	value int64
}

// registerInput is an operation's input; its output is whether it was
// admitted (admit, write) or the value read (read).
type registerInput struct {
	resource string
	op       string
	token    uint64
	value    int64 // write: the value it read (and increments)
}

type registerOutput struct {
	admitted bool
	value    int64 // read
}

func partitionBy(key func(op porcupine.Operation) string) func([]porcupine.Operation) [][]porcupine.Operation {
	return func(history []porcupine.Operation) [][]porcupine.Operation {
		groups := map[string][]porcupine.Operation{}
		var keys []string
		for _, op := range history {
			k := key(op)
			if _, seen := groups[k]; !seen {
				keys = append(keys, k)
			}
			groups[k] = append(groups[k], op)
		}
		sort.Strings(keys)
		parts := make([][]porcupine.Operation, 0, len(keys))
		for _, k := range keys {
			parts = append(parts, groups[k])
		}
		return parts
	}
}

var registerModel = porcupine.Model{
	Partition: partitionBy(func(op porcupine.Operation) string { return op.Input.(registerInput).resource }),
	Init:      func() interface{} { return register{} },
	Step: func(state, input, output interface{}) (bool, interface{}) {
		s := state.(register)
		in := input.(registerInput)
		out := output.(registerOutput)
		switch in.op {
		case "admit":
			if out.admitted {
				return in.token >= s.floor, register{floor: in.token, value: s.value}
			}
			return in.token < s.floor, s
		case "read":
			return out.value == s.value, s
		case "write":
			if out.admitted {
				ok := in.token >= s.floor && in.value == s.value
				return ok, register{floor: in.token, value: in.value + 1}
			}
			return in.token < s.floor, s
		}
		return false, s
	},
	DescribeOperation: func(input, output interface{}) string {
		in := input.(registerInput)
		out := output.(registerOutput)
		switch in.op {
		case "read":
			return fmt.Sprintf("read() -> %d", out.value)
		case "write":
			return fmt.Sprintf("write(token %d, %d -> %d) admitted=%v", in.token, in.value, in.value+1, out.admitted)
		}
		return fmt.Sprintf("admit(token %d) = %v", in.token, out.admitted)
	},
	DescribeState: func(state interface{}) string {
		s := state.(register)
		return fmt.Sprintf("floor %d, value %d", s.floor, s.value)
	},
}

type grantInput struct {
	resource string
	token    uint64
}

var tokenModel = porcupine.Model{
	Partition: partitionBy(func(op porcupine.Operation) string { return op.Input.(grantInput).resource }),
	Init:      func() interface{} { return uint64(0) },
	Step: func(state, input, _ interface{}) (bool, interface{}) {
		highest := state.(uint64)
		in := input.(grantInput)
		return in.token > highest, in.token
	},
	DescribeOperation: func(input, _ interface{}) string {
		return fmt.Sprintf("granted token %d", input.(grantInput).token)
	},
}

type holdInput struct {
	resource string
	acquire  bool // else the release
	client   int
	token    uint64
}

// free is the mutex's state when nobody holds it; else the holder's client.
const free = -2

var holdModel = porcupine.Model{
	Partition: partitionBy(func(op porcupine.Operation) string { return op.Input.(holdInput).resource }),
	Init:      func() interface{} { return free },
	Step: func(state, input, _ interface{}) (bool, interface{}) {
		holder := state.(int)
		in := input.(holdInput)
		if in.acquire {
			return holder == free, in.client
		}
		return holder == in.client, free
	},
	DescribeOperation: func(input, _ interface{}) string {
		in := input.(holdInput)
		if in.acquire {
			return fmt.Sprintf("worker %d acquires (token %d)", in.client, in.token)
		}
		return fmt.Sprintf("worker %d stops trusting token %d", in.client, in.token)
	},
	DescribeState: func(state interface{}) string {
		if state.(int) == free {
			return "free"
		}
		return fmt.Sprintf("held by worker %d", state.(int))
	},
}

func registerOps(h *history) []porcupine.Operation {
	ops := make([]porcupine.Operation, 0, len(h.Register))
	for _, r := range h.Register {
		ops = append(ops, porcupine.Operation{
			ClientId: r.Client + 1, // the harness's final read is client -1
			Input:    registerInput{resource: r.Resource, op: r.Op, token: r.Token, value: r.Value},
			Call:     r.Call,
			Output:   registerOutput{admitted: r.Admitted, value: r.Value},
			Return:   r.Ret,
		})
	}
	return ops
}

func grantOps(h *history) []porcupine.Operation {
	ops := make([]porcupine.Operation, 0, len(h.Grants))
	for _, g := range h.Grants {
		ops = append(ops, porcupine.Operation{
			ClientId: g.Client,
			Input:    grantInput{resource: g.Resource, token: g.Token},
			Call:     g.Call,
			Return:   g.Ret,
		})
	}
	return ops
}

// holdOps turns each hold into an acquire over its request and answer and
// a release at the instant its trust ended.
func holdOps(h *history) []porcupine.Operation {
	ops := make([]porcupine.Operation, 0, 2*len(h.Holds))
	for _, o := range h.Holds {
		in := holdInput{resource: o.Resource, acquire: true, client: o.Client, token: o.Token}
		ops = append(ops, porcupine.Operation{ClientId: o.Client, Input: in, Call: o.Call, Return: o.Ret})
		in.acquire = false
		ops = append(ops, porcupine.Operation{ClientId: o.Client, Input: in, Call: o.End, Return: o.End})
	}
	return ops
}

// verdicts is what Porcupine found, per specification.
type verdicts struct {
	register, tokens, holds bool
}

// verdict checks one history: whether Porcupine found it linearizable, per
// specification, or an error when a check did not finish.
func verdict(h *history, timeout time.Duration) (v verdicts, err error) {
	check := func(model porcupine.Model, ops []porcupine.Operation) (bool, error) {
		switch porcupine.CheckOperationsTimeout(model, ops, timeout) {
		case porcupine.Ok:
			return true, nil
		case porcupine.Illegal:
			return false, nil
		default:
			return false, fmt.Errorf("no verdict within %v", timeout)
		}
	}
	if v.register, err = check(registerModel, registerOps(h)); err != nil {
		return
	}
	if v.tokens, err = check(tokenModel, grantOps(h)); err != nil {
		return
	}
	v.holds, err = check(holdModel, holdOps(h))
	return
}

func main() {
	expect := flag.Bool("expect-violations", false, "fail unless every history is found not linearizable")
	timeout := flag.Duration("timeout", 2*time.Minute, "the longest one check may take")
	flag.Parse()
	if flag.NArg() == 0 {
		fmt.Fprintln(os.Stderr, "usage: porcupine-check [-expect-violations] [-timeout 2m] HISTORY.json...")
		os.Exit(2)
	}
	failed := false
	for _, path := range flag.Args() {
		raw, err := os.ReadFile(path)
		if err != nil {
			fmt.Fprintln(os.Stderr, err)
			os.Exit(2)
		}
		var h history
		if err := json.Unmarshal(raw, &h); err != nil {
			fmt.Fprintf(os.Stderr, "%s: not a torture history: %v\n", path, err)
			os.Exit(2)
		}
		v, err := verdict(&h, *timeout)
		if err != nil {
			fmt.Fprintf(os.Stderr, "%s: %v\n", path, err)
			os.Exit(2)
		}
		fmt.Printf("%s: %s workload, %d register operations, %d grants, %d holds; porcupine: register %s, tokens %s, holds %s; torture checker: %d register and %d token violations, %d overlapping holds\n",
			path, h.Workload, len(h.Register), len(h.Grants), len(h.Holds),
			linearizable(v.register), linearizable(v.tokens), linearizable(v.holds),
			h.CheckerRegisterViolations, h.CheckerTokenViolations, h.CheckerHoldOverlaps)
		if v.register != (h.CheckerRegisterViolations == 0) {
			fmt.Printf("%s: DISAGREEMENT on the register\n", path)
			failed = true
		}
		if v.tokens != (h.CheckerTokenViolations == 0) {
			fmt.Printf("%s: DISAGREEMENT on token order\n", path)
			failed = true
		}
		if v.holds != (h.CheckerHoldOverlaps == 0) {
			fmt.Printf("%s: DISAGREEMENT on the holds\n", path)
			failed = true
		}
		if *expect && v.register && v.tokens {
			fmt.Printf("%s: expected violations, porcupine found none\n", path)
			failed = true
		}
	}
	if failed {
		os.Exit(1)
	}
}

func linearizable(ok bool) string {
	if ok {
		return "linearizable"
	}
	return "NOT linearizable"
}
