/*
 * agentguard's claim protocol, for the spin model checker.
 *
 * What is modelled, and why it is faithful (docs/architecture.md, "Proofs"):
 *
 * - The store (agentguard/stores/_statements.py): one record per key (the row of agentguard_calls) and the
 *   steps of multi-step operations (rows of agentguard_steps). Every store verb below is one `atomic`
 *   block, as each real statement is one atomic statement (or one transaction that first re-checks the
 *   claim: put_step, clear_step). Their guards are the statements' WHERE clauses, their effects the SET lists.
 * - The claim (stores/_claims.py): a worker follows, at each claim, either of the two claim plans, chosen
 *   nondeterministically, so every hint the engine may follow is covered: "insert first" for a key likely
 *   free (INSERT ... ON CONFLICT (scope, key) DO NOTHING; on a conflict, read the record and decide on it)
 *   and "read first" for a key likely taken (a plain read; only if it read nothing, the insert, which
 *   decides; a record read that is not a completed one goes on to the same decisions as the insert's loser).
 *   Each statement is its own atomic step, which allows every interleaving that a plan run in one statement
 *   or one hop (a read-or-claim function, SQLite's read and insert on one connection) allows.
 * - The database's clock (proctype Clock): one clock for every worker. A record's lease_until and
 *   expires_at are kept as the ticks left before them (`lease`, `ttl`), so the state space stays finite while
 *   the clock ticks forever. live = running and lease > 0; past retention = ttl == 0.
 * - Workers (proctype Worker): each runs Machine.begin, the body (with the heartbeat's renewals), then
 *   Machine.succeed or Machine.fail, one call per key. Any worker may pause for any number of ticks between
 *   any two statements (past its lease, past retention) and wake: spin explores every interleaving with
 *   the clock. A worker may crash (a SIGKILL: its local state is lost) and its agent resumes the call.
 * - The sweeper (proctype Sweeper): Guard.sweep, any time.
 * - The provider honours idempotency keys: the first request with a key charges, later ones get its response.
 *
 * Properties (assertions: run pan; the LTL formula: run pan -a -f -N taken_over):
 *   fenced          no write lands with a fence other than the current holder's (no stale fence overwrites
 *                   a result, a step, a release or a lease)
 *   one_body        at most one body runs per live claim (no two workers in a body with the same claim)
 *   granted         a body runs only under a claim the store granted this worker (the insert's row count or
 *                   a fenced takeover decided it, never a read)
 *   exclusive       a claim is never granted while another is live
 *   replay          every caller of an operation gets the one stored result (first caller and every replay)
 *   one_charge      the provider charges at most once per downstream key and sub-key
 *   step_origin     a step's recorded result is only ever read by the operation that recorded it, and a
 *                   step recorded done is never started again by its operation
 *   taken_over      (liveness, under weak fairness) a claim whose worker crashed is eventually taken over
 *                   (or, past retention, swept)
 *
 * Deliberately broken variants, which spin must refute (tests/whitebox/test_model.py):
 *   -DBROKEN_FENCE_RESTART   a release deletes the row and a new row's fences start again at 1
 *   -DBROKEN_UNFENCED_COMPLETE  the completion is conditional on the state only, not on the fence
 *   -DBROKEN_READ_FIRST      read first runs the body after reading "absent", whatever the insert answered
 *   -DBROKEN_READ_FIRST_UPSERT  read first writes the claim after reading "absent" with an upsert (INSERT ...
 *                            ON CONFLICT DO UPDATE): the read decided, the write does not check
 *
 * Sizes: -DW=workers (2-3), -DK=keys (1-2), -DSTEPKEY=the first key whose body is a multi-step operation
 * (one step through op.step; K: none).
 */

#ifndef W
#define W 2
#endif
#ifndef K
#define K 1
#endif
#ifndef STEPKEY
#define STEPKEY K
#endif
#ifndef LEASE
#define LEASE 1         /* ticks of the database clock a claim or a renewal holds the lease */
#endif
#ifndef RETENTION
#define RETENTION 2     /* ticks a record is kept after it was claimed or completed */
#endif
#ifndef MAXCRASH
#define MAXCRASH 1      /* crashes per worker */
#endif
#ifndef CALLS
#define CALLS 2         /* calls per worker and key: an agent retries once after a released claim */
#endif
#ifndef MAX_VANISHED
#define MAX_VANISHED 2  /* Machine.begin: bounded retries when the record vanishes between insert and read */
#endif
#define SLOTS 5         /* step rows per key (one step name, one row per origin) */

/* The record states (agentguard.stores: RUNNING, SUCCEEDED, FAILED, RELEASED); absent: no row. */
mtype:record_state = { absent, running, succeeded, failed, released };
/* The step states (agentguard.stores: STARTED, DONE); none: no row. */
mtype:step_state = { none, started, done };

typedef Record {
    mtype:record_state state;
    byte fence;
    byte origin;     /* the fence the row was (re)born with: steps belong to one origin */
    byte lease;      /* ticks left before lease_until (0: the lease has expired) */
    byte ttl;        /* ticks left before expires_at (0: past retention) */
    byte result;     /* 0: none */
    /* ghosts: not in the database */
    byte inc;        /* which operation the record is: a new one at an insert and at a takeover past retention */
    byte holder;     /* the worker (1..W) that holds the current fence; 0: nobody */
}

typedef StepRow {
    mtype:step_state state;
    byte origin;
    byte result;
    byte inc;        /* ghost: the operation that wrote it */
}

Record rec[K];
StepRow steps[K * SLOTS];
byte fences[K];      /* the last fence issued for each key: a fence never repeats, not even after a delete */

/* ghosts */
byte incs[K];        /* operations (incarnations) of each key so far */
byte said[K];        /* the result every caller of the current operation got */
byte said_inc[K];
byte done_inc[K];    /* the operation in which the key's step was recorded done */
bool charged[K * 2]; /* the provider: [k * 2] the operation's downstream key, [k * 2 + 1] its step's sub-key */
byte response[K * 2];
byte in_body[W];     /* 1 + the key of the body the worker runs now; 0: none */
byte body_fence[W];
bool orphan[K];      /* the current claim's worker crashed while holding it */

#define live(k)    (rec[k].state == running && rec[k].lease > 0)
#define holder_ok(k) (rec[k].holder == w + 1)

/* -- helpers (not statements) ------------------------------------------------------------------------- */

inline new_fence(k) {
#ifdef BROKEN_FENCE_RESTART
    fences[k] = 1  /* the broken variant: a new row's fences start again */
#else
    fences[k]++
#endif
}

inline exclusive(k) {
    /* a claim is granted (an insert, a takeover) only where no other claim is live (ghost check) */
    assert(!live(k))
}

inline answer(k, v) {
    /* every caller of one operation gets the same result: the one stored (ghost check) */
    if
    :: said_inc[k] == rec[k].inc -> assert(said[k] == v)
    :: else -> said_inc[k] = rec[k].inc; said[k] = v
    fi
}

inline delete_row(k) {
    rec[k].state = absent; rec[k].fence = 0; rec[k].origin = 0; rec[k].lease = 0;
    rec[k].ttl = 0; rec[k].result = 0; rec[k].inc = 0; rec[k].holder = 0
}

inline charge(slot, v, got) {
    /* the provider honours the key: the first request charges, later ones get its response */
    atomic {
        if
        :: !charged[slot] -> charged[slot] = true; response[slot] = v; printf("MSC: w%d provider: charged key %d\n", w, slot)
        :: else -> printf("MSC: w%d provider: key %d seen, replayed\n", w, slot)
        fi;
        got = response[slot]
    }
}

/* -- the store's verbs (SQLStore; each one statement, or one fenced transaction) ------------------------ */

inline claim(k) {
    /* INSERT ... ON CONFLICT (scope, key) DO NOTHING RETURNING fence */
    atomic {
        if
        :: rec[k].state == absent ->
            exclusive(k);
            new_fence(k);
            rec[k].state = running; rec[k].fence = fences[k]; rec[k].origin = fences[k];
            rec[k].lease = LEASE; rec[k].ttl = RETENTION; rec[k].result = 0;
            incs[k]++; rec[k].inc = incs[k]; rec[k].holder = w + 1; orphan[k] = false;
            myfence = rec[k].fence; myorigin = rec[k].origin; myinc = rec[k].inc; got = true;
            printf("MSC: w%d claim k%d: inserted, fence %d\n", w, k, myfence)
        :: else -> got = false
        fi
    }
}

inline read(k) {
    /* SELECT ... (state, fence, result, live, expired, ...) */
    atomic {
        s_state = rec[k].state; s_fence = rec[k].fence; s_result = rec[k].result;
        s_live = live(k); s_expired = (rec[k].ttl == 0);
        printf("MSC: w%d read k%d: %e fence %d live %d expired %d\n", w, k, s_state, s_fence, s_live, s_expired);
        if  /* a completed record within retention is replayed: check it against what callers got */
        :: s_state != absent && !s_expired && (s_state == succeeded || s_state == failed) -> answer(k, s_result)
        :: else
        fi
    }
}

inline take_over(k, seen, reset) {
    /* UPDATE ... SET fence = fence + 1, state = running, ... WHERE fence = :fence AND NOT live
         AND CASE WHEN :reset = 1 THEN expires_at < now ELSE state IN (running, released) END
         RETURNING fence, origin */
    atomic {
        if
        :: rec[k].state != absent && rec[k].fence == seen && !live(k) &&
#ifdef BUG_TAKEOVER_COMPLETED
           (rec[k].state == running || rec[k].state == released || rec[k].ttl == 0) ->
#else
           ((reset && rec[k].ttl == 0) || (!reset && (rec[k].state == running || rec[k].state == released))) ->
#endif
            exclusive(k);
            if  /* ghost: a reset (past retention) starts a new operation; a completed one is never continued */
            :: reset || rec[k].state == succeeded || rec[k].state == failed -> incs[k]++; rec[k].inc = incs[k]
            :: else
            fi;
            rec[k].fence = rec[k].fence + 1; fences[k] = rec[k].fence;
            rec[k].state = running; rec[k].lease = LEASE; rec[k].ttl = RETENTION; rec[k].result = 0;
            rec[k].origin = (reset -> rec[k].fence : rec[k].origin);
            rec[k].holder = w + 1; orphan[k] = false;
            myfence = rec[k].fence; myorigin = rec[k].origin; myinc = rec[k].inc; got = true;
            printf("MSC: w%d take_over k%d (seen fence %d, reset %d): fence %d origin %d\n", w, k, seen, reset, myfence, myorigin)
        :: else -> got = false; printf("MSC: w%d take_over k%d (seen fence %d): refused\n", w, k, seen)
        fi
    }
}

inline renew(k) {
    /* UPDATE ... SET lease_until = now + :lease WHERE fence = :fence AND state = running */
    atomic {
        if
        :: rec[k].state == running && rec[k].fence == myfence -> assert(holder_ok(k)); rec[k].lease = LEASE;
            printf("MSC: w%d renew k%d fence %d\n", w, k, myfence)
        :: else -> printf("MSC: w%d renew k%d fence %d: refused\n", w, k, myfence)
        fi
    }
}

inline complete(k, st, v) {
    /* UPDATE ... SET state = :state, result = :result WHERE fence = :fence
         AND (state = running OR (state = :state AND result = :result)) RETURNING fence */
    atomic {
        if
#ifdef BROKEN_UNFENCED_COMPLETE
        :: rec[k].state == running || (rec[k].state == st && rec[k].result == v && rec[k].fence == myfence) ->
#else
        :: rec[k].fence == myfence && rec[k].state != absent &&
           (rec[k].state == running || (rec[k].state == st && rec[k].result == v)) ->
#endif
            assert(holder_ok(k));  /* fenced: no stale fence ever overwrites a result */
            rec[k].state = st; rec[k].result = v; rec[k].lease = 0; rec[k].ttl = RETENTION;
            printf("MSC: w%d complete k%d fence %d: result %d (the holder: w%d)\n", w, k, myfence, v, rec[k].holder - 1);
            answer(k, v); ok = true  /* the first caller gets the stored value too */
        :: else -> ok = false; printf("MSC: w%d complete k%d fence %d: refused\n", w, k, myfence)
        fi
    }
}

inline release(k) {
    /* UPDATE ... SET state = released WHERE fence = :fence AND state IN (running, released) RETURNING fence */
    atomic {
        if
        :: rec[k].fence == myfence && (rec[k].state == running || rec[k].state == released) ->
            assert(holder_ok(k));
#ifdef BROKEN_FENCE_RESTART
            delete_row(k);  /* the broken variant: a release deletes the row */
#else
            rec[k].state = released; rec[k].lease = 0; rec[k].ttl = RETENTION;
#endif
            ok = true; printf("MSC: w%d release k%d fence %d\n", w, k, myfence)
        :: else -> ok = false; printf("MSC: w%d release k%d fence %d: refused\n", w, k, myfence)
        fi
    }
}

inline load_steps(k) {
    /* SELECT name, seq, state, result FROM agentguard_steps WHERE scope, key AND origin = :origin */
    atomic {
        s_step = none; s_step_result = 0;
        for (i : 0 .. SLOTS - 1) {
            if
            :: steps[k * SLOTS + i].state != none && steps[k * SLOTS + i].origin == myorigin ->
                s_step = steps[k * SLOTS + i].state; s_step_result = steps[k * SLOTS + i].result;
                /* the worker that holds the claim reads only the steps of its own operation */
                assert(rec[k].fence != myfence || steps[k * SLOTS + i].inc == myinc)
            :: else
            fi
        }
        printf("MSC: w%d load_steps k%d origin %d: %e\n", w, k, myorigin, s_step)
    }
}

inline put_step(k, st, v) {
    /* a transaction: fence_check (UPDATE ... WHERE fence = :fence AND state = running RETURNING origin,
       which also renews the lease), then INSERT ... ON CONFLICT (scope, key, origin, name) DO UPDATE */
    atomic {
        if
        :: rec[k].state == running && rec[k].fence == myfence ->
            assert(holder_ok(k));
            rec[k].lease = LEASE;
            j = SLOTS;
            for (i : 0 .. SLOTS - 1) {
                if
                :: j == SLOTS && steps[k * SLOTS + i].state != none && steps[k * SLOTS + i].origin == myorigin -> j = i
                :: else
                fi
            }
            if
            :: j == SLOTS ->
                for (i : 0 .. SLOTS - 1) {
                    if
                    :: j == SLOTS && steps[k * SLOTS + i].state == none -> j = i
                    :: else
                    fi
                }
            :: else
            fi;
            assert(j < SLOTS);  /* the model's table is big enough */
            if  /* a step recorded done is never started again by its operation */
            :: st == started -> assert(done_inc[k] != myinc)
            :: else -> done_inc[k] = myinc
            fi;
            steps[k * SLOTS + j].state = st; steps[k * SLOTS + j].origin = myorigin;
            steps[k * SLOTS + j].result = v; steps[k * SLOTS + j].inc = myinc;
            ok = true; printf("MSC: w%d put_step k%d fence %d origin %d: %d (1 started, 2 done)\n", w, k, myfence, myorigin, (st == started -> 1 : 2))
        :: else -> ok = false; printf("MSC: w%d put_step k%d fence %d: refused\n", w, k, myfence)
        fi
    }
}

inline clear_step(k) {
    /* a transaction: fence_check, then DELETE FROM agentguard_steps WHERE origin = :origin AND state = started */
    atomic {
        if
        :: rec[k].state == running && rec[k].fence == myfence ->
            assert(holder_ok(k));
            rec[k].lease = LEASE;
            for (i : 0 .. SLOTS - 1) {
                if
                :: steps[k * SLOTS + i].origin == myorigin && steps[k * SLOTS + i].state == started ->
                    steps[k * SLOTS + i].state = none; steps[k * SLOTS + i].origin = 0;
                    steps[k * SLOTS + i].result = 0; steps[k * SLOTS + i].inc = 0
                :: else
                fi
            }
            ok = true; printf("MSC: w%d clear_step k%d fence %d\n", w, k, myfence)
        :: else -> ok = false; printf("MSC: w%d clear_step k%d fence %d: refused\n", w, k, myfence)
        fi
    }
}

inline sweep(k) {
    /* DELETE FROM agentguard_calls WHERE expires_at < now AND NOT live (bounded batches: one row here) */
    atomic {
        if
        :: rec[k].state != absent && rec[k].ttl == 0 && !live(k) -> delete_row(k); printf("MSC: sweep k%d: deleted\n", k)
        :: else
        fi
    }
}

inline sweep_steps(k) {
    /* DELETE FROM agentguard_steps WHERE no record has the step's (scope, key, origin) */
    atomic {
        for (i : 0 .. SLOTS - 1) {
            if
            :: steps[k * SLOTS + i].state != none &&
               (rec[k].state == absent || rec[k].origin != steps[k * SLOTS + i].origin) ->
                steps[k * SLOTS + i].state = none; steps[k * SLOTS + i].origin = 0;
                steps[k * SLOTS + i].result = 0; steps[k * SLOTS + i].inc = 0
            :: else
            fi
        }
    }
}

/* -- end of the store's verbs ----------------------------------------------------------------------------- */

#ifdef BROKEN_READ_FIRST_UPSERT
inline upsert(k) {
    /* the broken variant's write after reading "absent", no statement of the store: INSERT ... ON CONFLICT
       (scope, key) DO UPDATE SET fence = :new, state = running, ... (the read decided; the write checks nothing) */
    atomic {
        exclusive(k);
        new_fence(k);
        if
        :: rec[k].state == absent -> rec[k].origin = fences[k]; incs[k]++; rec[k].inc = incs[k]
        :: else
        fi;
        rec[k].state = running; rec[k].fence = fences[k]; rec[k].lease = LEASE; rec[k].ttl = RETENTION;
        rec[k].result = 0; rec[k].holder = w + 1; orphan[k] = false;
        myfence = rec[k].fence; myorigin = rec[k].origin; myinc = rec[k].inc; got = true;
        printf("MSC: w%d upsert k%d: fence %d\n", w, k, myfence)
    }
}
#endif

#define ticking(k)  ((rec[k].state == running && rec[k].lease > 0) || (rec[k].state != absent && rec[k].ttl > 0))
#define sweepable(k) (rec[k].state != absent && rec[k].ttl == 0 && !live(k))

active proctype Clock() {
    /* the database's clock: every lease and retention is measured by it, never by a worker's clock */
    byte k;
end_clock:
    do
    :: atomic {
        (ticking(0) || ticking(K - 1)) ->
        for (k : 0 .. K - 1) {
            if
#ifndef BROKEN_NO_EXPIRY
            :: rec[k].state == running && rec[k].lease > 0 -> rec[k].lease--
#endif
            :: else
            fi;
            if
            :: rec[k].state != absent && rec[k].ttl > 0 -> rec[k].ttl--
            :: else
            fi
        }
        k = 0;
        printf("MSC: tick\n")
       }
    od
}

#ifndef NOSWEEP
active proctype Sweeper() {
    /* Guard.sweep, at any time: the records past retention, then the steps no record owns */
    byte k, i;
end_sweeper:
    do
    :: atomic { sweepable(0) -> sweep(0) }
    :: atomic { K > 1 && sweepable(K - 1) -> sweep(K - 1) }
    :: atomic { k = 0; do :: k < K -> sweep_steps(k); k++ :: else -> break od; k = 0; i = 0 }
    od
}
#endif

/* what Machine.begin decides on the record it read */
#define VANISHED 1
#define REPLAY 2
#define TAKE_OVER 3
#define WAIT 4
#define INSERT 5

inline decide(on_absent) {
    /* Machine.begin's decision, on what it read (local: folded into the read's step); on_absent: nothing read */
    if
    :: s_state == absent -> act = on_absent
    :: else ->
        stale = s_expired && !s_live;  /* past retention: a new operation */
        if
        :: !stale && (s_state == succeeded || s_state == failed) -> act = REPLAY
        :: else -> act = (stale || !s_live -> TAKE_OVER : WAIT)
        fi
    fi;
    s_state = absent; s_result = 0; s_live = false; s_expired = false
}

proctype Worker(byte w) {
    byte k, calls, crashes, vanished, val, i, j, x, act;
    byte myfence, myorigin, myinc;
    bool got, ok, stale;
    mtype:record_state s_state;
    mtype:step_state s_step;
    byte s_fence, s_result, s_step_result;
    bool s_live, s_expired;

    k = 0;
next_key:
    calls = 0;
call:
    calls++;
begin:  /* Machine.begin */
    vanished = 0;
claiming:
    if  /* the claim plan, either at each claim (the engine's hint: a key likely free, a key likely taken) */
    :: goto read_first
    :: skip
    fi;
inserting:  /* insert first: the insert decides; on a conflict, the record is read */
    claim(k);
    if
    :: got -> goto claimed
    :: else
    fi;
    atomic { read(k); decide(VANISHED) }
    goto decided;
read_first:  /* read first: a plain read; only if it read nothing, the insert (which decides) */
    atomic { read(k); decide(INSERT) }
decided:
    if
    :: act == INSERT ->
        atomic { act = 0; s_fence = 0; stale = false; printf("MSC: w%d read first k%d: absent, insert\n", w, k) }
#if defined(BROKEN_READ_FIRST)
        claim(k);  /* the broken variant: the insert does not decide, the body runs whatever it answered */
        goto claimed
#elif defined(BROKEN_READ_FIRST_UPSERT)
        upsert(k);
        goto claimed
#else
        goto inserting
#endif
    :: act == VANISHED ->  /* the winner's row vanished (swept) between our insert and our read */
        atomic { act = 0; s_fence = 0; vanished++ }
        if
        :: vanished >= MAX_VANISHED -> goto in_progress
        :: else -> goto claiming
        fi
    :: act == REPLAY -> atomic { act = 0; s_fence = 0 }; goto replayed
    :: act == TAKE_OVER ->
        take_over(k, s_fence, stale);
        atomic { act = 0; s_fence = 0; stale = false }
        if
        :: got -> goto claimed
        :: else -> goto claiming  /* another caller took it first: look again */
        fi
    :: act == WAIT -> atomic { act = 0; s_fence = 0; stale = false }; goto claiming  /* a live claim: wait, claim again */
    fi;

claimed:  /* Machine.claimed: the heartbeat starts; the body runs */
    atomic {
        assert(myfence != 0);  /* granted: the body runs under a claim the store granted this worker */
        for (i : 0 .. W - 1) {  /* at most one body runs per live claim */
            assert(i == w || in_body[i] != k + 1 || body_fence[i] != myfence)
        }
        i = 0; got = false; vanished = 0;
        in_body[w] = k + 1; body_fence[w] = myfence;
        val = myfence  /* what this run of the body returns: different for every run (a claim's fence is unique) */
    }
    if
    :: k >= STEPKEY -> goto step
    :: else
    fi;
    do  /* the heartbeat renews the lease while the body runs (any number of times; or the worker pauses) */
    :: true -> renew(k)
    :: break
    od;
    charge(k * 2, val, x);
    x = 0;
    goto outcome;

step:  /* a multi-step operation: op.step("charge", provider, ..., op.key("charge")) */
    load_steps(k);
    i = 0;
    if
    :: s_step == done -> atomic { s_step = none; s_step_result = 0 }; goto outcome  /* recorded: not run again */
    :: else -> atomic { s_step = none; s_step_result = 0 }  /* none, or started (unknown: on_unknown='retry') */
    fi;
    put_step(k, started, 0);
    atomic { i = 0; j = 0 }
    if
    :: !ok -> goto lease_lost
    :: else
    fi;
    charge(k * 2 + 1, val, x);  /* the step's foreign call, with the step's sub-key */
    if
    :: crashes < MAXCRASH -> goto crash  /* killed inside the step: its outcome is unknown */
    :: true -> put_step(k, done, x)  /* the step ran: its result (settled: redone through an outage) */
    :: true -> clear_step(k)         /* the step raised: its started mark is cleared */
    fi;
    atomic { i = 0; j = 0; x = 0 }
    if
    :: !ok -> goto lease_lost
    :: else
    fi;

outcome:
    if
    :: crashes < MAXCRASH -> goto crash  /* killed after the provider call, before recording */
    :: atomic { in_body[w] = 0; body_fence[w] = 0 }; goto succeed  /* the body returned */
    :: atomic { in_body[w] = 0; body_fence[w] = 0 }; goto fail     /* the body raised */
    fi;

succeed:  /* Machine.succeed: the result, fenced (retried through an outage: a redo finds its own write) */
    complete(k, succeeded, val);
    if
    :: ok -> goto finished
    :: else -> goto lease_lost
    fi;

fail:  /* Machine.fail: the body raised; a cached error would be stored by complete (as succeed does, with
          state failed); anything else releases the claim */
    release(k);
    atomic { in_body[w] = 0; body_fence[w] = 0; myfence = 0; myorigin = 0; myinc = 0; val = 0; ok = false }
    if
    :: calls < CALLS -> goto call  /* the agent retries the call: a takeover, same downstream key */
    :: else -> goto next
    fi;

replayed:  /* Machine.replayed: the stored outcome (checked against what other callers got, in read) */
    goto next;

lease_lost:  /* Machine.lease_lost: a clear error; the other worker's outcome stands */
    goto finished;

in_progress:  /* Machine.in_progress: a clear error, nothing ran; the agent retries */
    vanished = 0;
    if
    :: calls < CALLS -> goto call
    :: else -> goto next
    fi;

crash:  /* SIGKILL: the local state is gone; the agent resumes the same call */
    atomic {
        printf("MSC: w%d crashed\n", w);
        crashes++;
        in_body[w] = 0; body_fence[w] = 0;
        if
        :: rec[k].state == running && holder_ok(k) -> orphan[k] = true
        :: else
        fi;
        myfence = 0; myorigin = 0; myinc = 0; val = 0; x = 0; ok = false
    }
    goto begin;

finished:
    atomic { in_body[w] = 0; body_fence[w] = 0; myfence = 0; myorigin = 0; myinc = 0; val = 0; ok = false }
next:
    k++;
    if
    :: k < K -> goto next_key
    :: else
    fi;
end:
    skip
}

init {
    byte n;
    atomic {
        for (n : 0 .. K - 1) {  /* an empty store (mtype values start at 1: say so) */
            rec[n].state = absent
        }
        for (n : 0 .. K * SLOTS - 1) {
            steps[n].state = none
        }
        for (n : 0 .. W - 1) {
            run Worker(n)
        }
    }
}

/* liveness: a claim whose worker crashed is eventually taken over (or swept), under weak fairness */
ltl taken_over { [] ((orphan[0] -> <> !orphan[0]) && (orphan[K - 1] -> <> !orphan[K - 1])) }
