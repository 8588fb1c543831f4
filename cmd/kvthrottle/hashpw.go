package main

import (
	"bufio"
	"fmt"
	"io"
	"strings"

	"github.com/kvthrottle/kvthrottle/bucketcfg"
)

const hashPasswordUsage = `usage: kvthrottle hash-password < PASSWORD

Reads one password line on standard input and prints what a [[user]] needs to
log in with it, salted at random: the scram_sha256 and scram_sha512 lines
(TOML, for SCRAM), then the bare password_hash value (bcrypt, for SASL PLAIN
and text authentication) as the last line.
`

// cmdHashPassword reads one password line on stdin and prints what a
// [[user]] table needs to log in with it:
//
//	scram_sha256 = "SCRAM-SHA-256$15000:...$...:..." (TOML, for SCRAM-SHA256)
//	scram_sha512 = "SCRAM-SHA-512$15000:...$...:..." (TOML, for SCRAM-SHA512)
//	$2a$10$...                                       (the password_hash value, for SASL PLAIN)
//
// each salted at random (bcrypt cost bucketcfg.DefaultHashCost, SCRAM
// bucketcfg.DefaultSCRAMIterations). The last line is the bare
// password_hash value, as DESIGN.md section 6 promises scripts that take
// it with `tail -n 1`. The password is never printed.
func cmdHashPassword(args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) == 1 && (args[0] == "-h" || args[0] == "-help" || args[0] == "--help") {
		fmt.Fprint(stdout, hashPasswordUsage)
		return 0
	}
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
	var out string
	for _, sh := range []bucketcfg.SCRAMHash{bucketcfg.SCRAMSHA256, bucketcfg.SCRAMSHA512} {
		v, err := bucketcfg.HashSCRAM(sh, pw, bucketcfg.DefaultSCRAMIterations)
		if err != nil {
			fmt.Fprintf(stderr, "kvthrottle hash-password: %v\n", err)
			return 1
		}
		key := "scram_sha256"
		if sh == bucketcfg.SCRAMSHA512 {
			key = "scram_sha512"
		}
		out += fmt.Sprintf("%s = %q\n", key, v)
	}
	out += h + "\n"
	fmt.Fprint(stdout, out)
	return 0
}
