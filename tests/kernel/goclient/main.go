// Command goclient is the Go connect client of the kernel engine's tests:
// Go's runtime makes its own system calls, so the preloaded library never
// sees them.
//
// usage: goclient HOST:PORT COUNT
//
// Dials COUNT TCP connections one after the other and prints one line per
// attempt, "ok" or "err ERRNO MICROSECONDS", then "held N"; keeps them open
// until standard input ends, closes them and prints "closed".
package main

import (
	"bufio"
	"errors"
	"fmt"
	"net"
	"os"
	"strconv"
	"syscall"
	"time"
)

func main() {
	if len(os.Args) != 3 {
		fmt.Fprintln(os.Stderr, "usage: goclient HOST:PORT COUNT")
		os.Exit(2)
	}
	n, err := strconv.Atoi(os.Args[2])
	if err != nil || n <= 0 {
		fmt.Fprintln(os.Stderr, "goclient: bad count")
		os.Exit(2)
	}
	var held []net.Conn
	for i := 0; i < n; i++ {
		t0 := time.Now()
		c, err := net.DialTimeout("tcp", os.Args[1], 10*time.Second)
		if err == nil {
			held = append(held, c)
			fmt.Println("ok")
			continue
		}
		var errno syscall.Errno
		code := -1
		if errors.As(err, &errno) {
			code = int(errno)
		}
		fmt.Printf("err %d %d\n", code, time.Since(t0).Microseconds())
	}
	fmt.Printf("held %d\n", len(held))
	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
	}
	for _, c := range held {
		c.Close()
	}
	fmt.Println("closed")
}
