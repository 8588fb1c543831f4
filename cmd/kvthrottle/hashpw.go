package main

import (
	"bufio"
	"fmt"
	"io"
	"strings"

	"github.com/kvthrottle/kvthrottle/bucketcfg"
)

// cmdHashPassword reads one password line on stdin and prints its
// password_hash value as the last line of output.
func cmdHashPassword(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) != 0 {
		fmt.Fprintln(stderr, "kvthrottle hash-password takes no arguments; it reads the password on standard input")
		return 2
	}
	line, err := bufio.NewReader(stdin).ReadString('\n')
	if err != nil && err != io.EOF {
		fmt.Fprintf(stderr, "kvthrottle hash-password: read password: %v\n", err)
		return 1
	}
	pw := strings.TrimRight(line, "\r\n")
	if pw == "" {
		fmt.Fprintln(stderr, "kvthrottle hash-password: empty password")
		return 1
	}
	h, err := bucketcfg.HashPassword(pw)
	if err != nil {
		fmt.Fprintf(stderr, "kvthrottle hash-password: %v\n", err)
		return 1
	}
	fmt.Fprintln(stdout, h)
	return 0
}
