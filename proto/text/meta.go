package text

// metaFlags fills c.Meta from the tokens from start on and checks them as
// memcached's _meta_flag_preparse does. It returns the error line memcached
// picks ("" when the flags are good): a duplicate or unknown flag stops the
// check at once; other faults are remembered, the last one winning, and the
// check goes on. defaultMsg is the line for faults that set none (a bad F).
// It also returns the M flag's mode byte (0 without M).
func (c *Command) metaFlags(start, nt int, defaultMsg string) (msg string, mode byte) {
	var seen [127]bool
	bad := false
	msg = defaultMsg
	for i := start; i < nt-1; i++ {
		tok := c.toks[i]
		f := tok[0]
		if f >= 127 || seen[f] {
			return msgDupFlag, 0
		}
		seen[f] = true
		arg := tok[1:]
		switch f {
		case 'b':
			c.Base64 = true
			if _, ok := Base64DecodedLen(c.toks[1]); !ok {
				msg, bad = msgDecodeKey, true
			}
		case 'N', 'T', 'R':
			if _, ok := parseInt32(arg); !ok {
				msg, bad = msgBadToken, true
			}
		case 'l', 'O', 'P', 'L', 'k', 's', 't', 'c', 'f', 'v', 'h', 'u', 'I':
		case 'q':
			c.NoReply = true
		case 'F':
			if _, ok := parseUint32(arg); !ok {
				bad = true
			}
		case 'C':
			if _, ok := parseUint64(arg); !ok {
				msg, bad = msgBadToken, true
			}
		case 'M':
			if len(tok) != 2 {
				msg, bad = msgMLength, true
			} else {
				mode = tok[1]
			}
		case 'J':
			if _, ok := parseUint64(arg); !ok {
				msg, bad = msgBadInitial, true
			}
		case 'D':
			if _, ok := parseUint64(arg); !ok {
				msg, bad = msgBadDeltaValue, true
			}
		default:
			return msgInvalidFlag, 0
		}
		c.Meta = append(c.Meta, MetaFlag{Flag: f, Token: arg})
	}
	if !bad {
		msg = ""
	}
	return msg, mode
}

// opaqueTooLong reports an O flag longer than memcached allows.
func (c *Command) opaqueTooLong() bool {
	for _, f := range c.Meta {
		if f.Flag == 'O' && len(f.Token)+1 > MaxOpaqueLen {
			return true
		}
	}
	return false
}

// Flag returns the token of the first meta flag f of c and whether c has it.
func (c *Command) Flag(f byte) ([]byte, bool) {
	for _, m := range c.Meta {
		if m.Flag == f {
			return m.Token, true
		}
	}
	return nil, false
}

func (c *Command) metaGet(n, nt int) (int, error) {
	if nt < 3 {
		return n, c.fail(Error{Line: msgError})
	}
	c.Kind = KindMetaGet
	if len(c.toks[1]) > MaxKeyLen {
		return n, c.fail(Error{Line: msgBadFormat})
	}
	c.Key = c.toks[1]
	if nt > maxMetaTokens {
		return n, c.fail(Error{Line: msgMgTooMany})
	}
	if msg, _ := c.metaFlags(2, nt, msgBadFormat); msg != "" {
		return n, c.fail(Error{Line: msg})
	}
	if c.opaqueTooLong() {
		return n, c.fail(Error{Line: msgOpaqueTooLong, Applied: true})
	}
	return n, nil
}

func (c *Command) metaSet(buf []byte, n, nt, maxValue int) (int, error) {
	if nt < 3 {
		return n, c.fail(Error{Line: msgError})
	}
	c.Kind = KindMetaSet
	if len(c.toks[1]) > MaxKeyLen || nt == 3 {
		return n, c.fail(Error{Line: msgBadFormat})
	}
	c.Key = c.toks[1]
	if nt > maxMetaTokens {
		return n, c.fail(Error{Line: msgTooMany})
	}
	vlen, ok := parseInt32(c.toks[2])
	if !ok || vlen < 0 || int64(vlen) > maxValueLenMemcd {
		return n, c.fail(Error{Line: msgBadFormat})
	}
	swallow := int(vlen) + 2
	msg, mode := c.metaFlags(3, nt, msgBadFormat)
	if msg != "" {
		return n, c.fail(Error{Line: msg, Swallow: swallow})
	}
	opaque := c.opaqueTooLong()
	switch mode {
	case 0, 'E', 'A', 'P', 'R', 'S':
	default:
		return n, c.fail(Error{Line: msgMsMode, Swallow: swallow})
	}
	if opaque {
		return n, c.fail(Error{Line: msgOpaqueTooLong, Swallow: swallow})
	}
	return c.data(buf, n, int(vlen), maxValue, true)
}

func (c *Command) metaDelete(n, nt int) (int, error) {
	if nt < 3 {
		return n, c.fail(Error{Line: msgError})
	}
	c.Kind = KindMetaDelete
	if len(c.toks[1]) > MaxKeyLen {
		return n, c.fail(Error{Line: msgBadFormat})
	}
	c.Key = c.toks[1]
	if nt > maxMetaTokens {
		return n, c.fail(Error{Line: msgTooMany})
	}
	if msg, _ := c.metaFlags(2, nt, msgBadFormat); msg != "" {
		return n, c.fail(Error{Line: msgInvalidOrDup})
	}
	if c.opaqueTooLong() {
		return n, c.fail(Error{Line: msgOpaqueTooLong})
	}
	return n, nil
}

func (c *Command) metaArithmetic(n, nt int) (int, error) {
	if nt < 3 {
		return n, c.fail(Error{Line: msgError})
	}
	c.Kind = KindMetaArithmetic
	if len(c.toks[1]) > MaxKeyLen {
		return n, c.fail(Error{Line: msgBadFormat})
	}
	c.Key = c.toks[1]
	if nt > maxMetaTokens {
		return n, c.fail(Error{Line: msgTooMany})
	}
	msg, mode := c.metaFlags(2, nt, msgBadFormat)
	if msg != "" {
		return n, c.fail(Error{Line: msgInvalidOrDup})
	}
	switch mode {
	case 0, 'I', '+', 'D', '-':
	default:
		return n, c.fail(Error{Line: msgMaMode})
	}
	if c.opaqueTooLong() {
		return n, c.fail(Error{Line: msgOpaqueTooLong, Applied: true})
	}
	return n, nil
}

func (c *Command) metaDebug(n, nt int) (int, error) {
	c.Kind = KindMetaDebug
	if nt < 3 || len(c.toks[1]) > MaxKeyLen {
		return n, c.fail(Error{Line: msgBadFormat})
	}
	c.Key = c.toks[1]
	if nt >= 4 && string(c.toks[2]) == "b" {
		c.Base64 = true
		c.Meta = append(c.Meta, MetaFlag{Flag: 'b', Token: c.toks[2][1:]})
		if _, ok := Base64DecodedLen(c.Key); !ok {
			return n, c.fail(Error{Line: msgBadFormat})
		}
	}
	return n, nil
}
