package fleet

import (
	"context"
	"errors"
	"sync"
	"testing"

	"github.com/alicebob/miniredis/v2"
	"github.com/redis/go-redis/v9"
)

// replyHook fails the next call of the script (update.lua unless set):
// after it ran (its reply lost) or before it was sent (lost on its way);
// and, while cut, every call (the store unreachable, though the calls may
// have been sent).
type replyHook struct {
	mu                 sync.Mutex
	loseReply, loseCmd bool
	cut                bool
	src                string // the script's source: updateLua unless set
}

func (h *replyHook) hook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		h.mu.Lock()
		src := h.src
		if src == "" {
			src = updateLua
		}
		isUpdate := (cmd.Name() == "evalsha" || cmd.Name() == "eval") && len(cmd.Args()) > 3 &&
			(cmd.Args()[1] == redis.NewScript(src).Hash() || cmd.Args()[1] == src)
		cut, loseCmd, loseReply := h.cut, isUpdate && h.loseCmd, isUpdate && h.loseReply
		if isUpdate {
			h.loseCmd = false
		}
		h.mu.Unlock()
		if cut || loseCmd {
			cmd.SetErr(errors.New("i/o timeout"))
			return cmd.Err()
		}
		err := next(ctx, cmd)
		if loseReply && err == nil {
			h.mu.Lock()
			h.loseReply = false
			h.mu.Unlock()
			cmd.SetErr(errors.New("read: connection reset by peer"))
			return cmd.Err()
		}
		return err
	}
}

func resolveStore(t *testing.T) (*Store, *replyHook) {
	t.Helper()
	st, h := emptyResolveStore(t)
	if _, _, err := st.Seed(context.Background(), []byte(`{"v":0}`)); err != nil {
		t.Fatal(err)
	}
	return st, h
}

func emptyResolveStore(t *testing.T) (*Store, *replyHook) {
	t.Helper()
	mr := miniredis.RunT(t)
	rdb := redis.NewClient(&redis.Options{Addr: mr.Addr(), MaxRetries: -1})
	t.Cleanup(func() { rdb.Close() })
	h := &replyHook{}
	rdb.AddHook(procHook(h.hook))
	return newStore(rdb, "resolve"), h
}

// TestUpdateAnswerIsTheTruth: an update whose reply is lost after it ran
// answers success with the token in force; one lost on its way answers an
// error, and the write, arriving late, finds the document moved on; one
// whose store cannot be asked answers ErrOutcomeUnknown, not a plain
// failure.
func TestUpdateAnswerIsTheTruth(t *testing.T) {
	ctx := context.Background()
	t.Run("reply lost", func(t *testing.T) {
		st, h := resolveStore(t)
		_, tok, _, _ := st.Load(ctx)
		h.loseReply = true
		nt, err := st.Update(ctx, tok, []byte(`{"v":1}`))
		doc, cur, _, _ := st.Load(ctx)
		if err != nil || nt != cur || string(doc) != `{"v":1}` {
			t.Errorf("Update: token %q, %v; the store holds %s under %q: want success with the token in force", nt, err, doc, cur)
		}
	})
	t.Run("lost on its way", func(t *testing.T) {
		st, h := resolveStore(t)
		_, tok, _, _ := st.Load(ctx)
		h.loseCmd = true
		_, err := st.Update(ctx, tok, []byte(`{"v":1}`))
		if err == nil || errors.Is(err, ErrOutcomeUnknown) || errors.Is(err, ErrConflict) {
			t.Fatalf("Update: %v, want a failure that says it was not made", err)
		}
		// The same write arriving now (late, as a command sent before the
		// timeout could) is refused: the token moved on.
		if late, err := updateScript.Run(ctx, st.rdb, st.keys[:1], tok, `{"v":1}`, "late").Text(); err != nil || late != "" {
			t.Errorf("the late write: %q %v, want refused", late, err)
		}
		if doc, _, _, _ := st.Load(ctx); string(doc) != `{"v":0}` {
			t.Errorf("the store holds %s, want the document before the failed update", doc)
		}
	})
	t.Run("store lost", func(t *testing.T) {
		st, h := resolveStore(t)
		_, tok, _, _ := st.Load(ctx)
		h.cut = true
		if _, err := st.Update(ctx, tok, []byte(`{"v":1}`)); !errors.Is(err, ErrOutcomeUnknown) {
			t.Errorf("Update with the store lost: %v, want ErrOutcomeUnknown", err)
		}
	})
}

// TestSeedResolved: an admin change seeding an empty store whose reply is
// lost after it ran answers seeded, with the token in force.
func TestSeedResolved(t *testing.T) {
	st, h := emptyResolveStore(t)
	h.src, h.loseReply = seedLua, true
	tok, seeded, err := st.SeedResolved(context.Background(), []byte(`{"v":1}`))
	doc, cur, _, _ := st.Load(context.Background())
	if err != nil || !seeded || tok != cur || string(doc) != `{"v":1}` {
		t.Errorf("SeedResolved: %q %v %v; the store holds %s under %q: want seeded, the token in force", tok, seeded, err, doc, cur)
	}
}
