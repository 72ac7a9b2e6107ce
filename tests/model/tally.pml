/*
 * tally.pml - a Promela model of the two-step kill-safe tally (shim/admit/tally.c),
 * checked with spin: `make model`.
 *
 * One tally (count and tag: slot, give flag, generation, stamp) and two
 * slots (mark: generation, HELD, RELEASED, sequence). Two threads take and
 * give for slot 1 (two threads of one socket), one for slot 2; a closer
 * releases slot 1 while they run and reuses it for a new socket (next
 * generation); a killer may stop any one of them at any step. At every
 * state the count must equal what the slots hold (derived: the tag while
 * it names the slot, else the mark) plus at most one orphan take (a take
 * tagged with a released slot, undone by the next changer), and never
 * exceed the limit. After everyone has finished or died, a reclaimer
 * releases what is left and one more change of the tally must leave the
 * count at 0.
 *
 * Modelled as built: the slot's own operations write no mark; whoever
 * moves the tally away from another slot's tag first reflects it (always
 * writing the mark, sequence bumped) or undoes an orphan take; a take
 * checks its mark before and after its compare-and-swap; the release gives
 * what is held, then sets RELEASED by a compare-and-swap of the mark it
 * read; the stamp (own operations count it up, one on a foreign tag starts
 * from the slot's mark sequence) keeps the tally from coming back to a
 * value a preempted thread read. Widths are small (stamp 4 bits); the
 * model's runs are short enough that nothing wraps. Without the stamp,
 * spin finds the ABA that lets a stale reflection survive (a permit
 * counted that no slot holds).
 */
#define L 2
#define TAKE 0
#define GIVE 1
#define NS 3

byte cnt; byte ttag; bit tdir; byte tgen; byte tst;
#define SM 16
byte mgen[NS]; bit mheld[NS]; bit mrel[NS]; byte mseq[NS];
bit killed[8];
byte done;

#define ORPHAN (ttag != 0 && tdir == TAKE && (mrel[ttag] || mgen[ttag] != tgen))
#define HELDS(S) ((ttag == S && tgen == mgen[S] && !mrel[S]) -> (tdir == TAKE) : \
                  ((ttag == S) -> 0 : (mheld[S] && !mrel[S])))
#define INV (cnt == HELDS(1) + HELDS(2) + ORPHAN && cnt <= L)

active proctype monitor() { end: atomic { !INV -> assert(false) } }

#define TEQ(c,t,d,g) (cnt == c && ttag == t && tdir == d && tgen == g && tst == wst)

/* reflect the op that tally value (wc,wt,wd,wg) names, wt foreign */
inline reflect(wc, wt, wd, wg) {
	atomic { m_gen = mgen[wt]; m_held = mheld[wt]; m_rel = mrel[wt]; m_seq = mseq[wt] }
	do
	:: (m_gen != wg || m_rel) ->
		if
		:: wd == TAKE -> atomic { if :: TEQ(wc,wt,wd,wg) -> cnt = wc - 1; ttag = 0; tdir = 0; tgen = 0; tst = 0 :: else -> skip fi }
		:: else -> skip
		fi;
		break
	:: else ->
		if
		:: !TEQ(wc,wt,wd,wg) -> break
		:: else ->
			atomic {
				if
				:: (mgen[wt] == m_gen && mheld[wt] == m_held && mrel[wt] == m_rel && mseq[wt] == m_seq) ->
					mheld[wt] = (wd == TAKE); mseq[wt] = mseq[wt] + 1; ok = 1
				:: else -> m_gen = mgen[wt]; m_held = mheld[wt]; m_rel = mrel[wt]; m_seq = mseq[wt]; ok = 0
				fi
			}
			if :: ok -> break :: else -> skip fi
		fi
	od
}

/* result: 0 TAKEN, 1 FULL, 2 BUSY */
inline take(S, g, res) {
	do
	:: atomic { wc = cnt; wt = ttag; wd = tdir; wg = tgen; wst = tst };
		own = (wt == S && wg == g);
		if
		:: own && wd == TAKE -> res = 2; break
		:: own && wd != TAKE ->
			if :: (mgen[S] != g || mrel[S]) -> res = 2; break :: else -> skip fi;
			nst = (wst + 1) % SM
		:: !own ->
			atomic { m_gen = mgen[S]; m_held = mheld[S]; m_rel = mrel[S]; m_seq = mseq[S] };
			if :: (m_gen != g || m_rel || m_held) -> res = 2; break :: else -> skip fi;
			if :: wt != 0 -> reflect(wc, wt, wd, wg) :: else -> skip fi;
			nst = (m_seq * 4) % SM
		fi;
		if
		:: wc >= L -> res = 1; break
		:: else -> skip
		fi;
		atomic {
			if
			:: TEQ(wc,wt,wd,wg) -> cnt = wc + 1; ttag = S; tdir = TAKE; tgen = g; tst = nst; ok = 1
			:: else -> ok = 0
			fi
		}
		if
		:: ok ->
			if
			:: (mgen[S] != g || mrel[S]) ->
				atomic { if :: (cnt == wc + 1 && ttag == S && tdir == TAKE && tgen == g && tst == nst) -> cnt = wc; ttag = 0; tdir = 0; tgen = 0; tst = 0 :: else -> skip fi };
				res = 2
			:: else -> res = 0
			fi;
			break
		:: else -> skip
		fi
	od
}

/* res: 1 given, 0 not held */
inline give(S, g, res) {
	do
	:: atomic { wc = cnt; wt = ttag; wd = tdir; wg = tgen; wst = tst };
		own = (wt == S && wg == g);
		if
		:: wc == 0 -> res = 0; break
		:: else -> skip
		fi;
		if
		:: own && wd != TAKE -> res = 0; break
		:: own && wd == TAKE -> nst = (wst + 1) % SM
		:: !own ->
			atomic { m_gen = mgen[S]; m_held = mheld[S]; m_rel = mrel[S]; m_seq = mseq[S] };
			if :: (m_gen != g || m_rel || !m_held) -> res = 0; break :: else -> skip fi;
			if :: wt != 0 -> reflect(wc, wt, wd, wg) :: else -> skip fi;
			nst = (m_seq * 4) % SM
		fi;
		atomic {
			if
			:: TEQ(wc,wt,wd,wg) -> cnt = (wc > 0 -> wc - 1 : 0); ttag = S; tdir = GIVE; tgen = g; tst = nst; ok = 1
			:: else -> ok = 0
			fi
		}
		if :: ok -> res = 1; break :: else -> skip fi
	od
}

/* give everything, then RELEASED when nothing is held */
inline release(S, g) {
	do
	:: give(S, g, r);
		atomic { m_gen = mgen[S]; m_held = mheld[S]; m_rel = mrel[S]; m_seq = mseq[S] };
		if :: m_rel || m_gen != g -> break :: else -> skip fi;
		/* derive again: a take may have landed */
		atomic { wc = cnt; wt = ttag; wd = tdir; wg = tgen; wst = tst };
		if
		:: (wt == S && wg == g && wd == TAKE) -> skip	/* held again: loop */
		:: else ->
			atomic {
				if
				:: (mgen[S] == m_gen && mheld[S] == m_held && mrel[S] == m_rel && mseq[S] == m_seq) ->
					mheld[S] = 0; mrel[S] = 1; mseq[S] = mseq[S] + 1; ok = 1
				:: else -> ok = 0
				fi
			}
			if :: ok -> break :: else -> skip fi
		fi
	od
}

#define LOCALS byte wc, wt, wg, wst, nst, m_gen, m_seq, res, r; bit wd, m_held, m_rel, ok, own, held

proctype worker(byte S; byte n) {
	LOCALS; byte g = mgen[S], i;
	{
		for (i : 1 .. n) {
			take(S, g, res);
			if :: res == 0 -> give(S, g, r) :: else -> skip fi
		}
	} unless { killed[_pid] };
	done++
}

/* closes slot 1 and reuses it for a new socket (new generation) */
proctype closer(byte S) {
	LOCALS; byte g = mgen[S];
	{
		release(S, g);
		atomic { mgen[S] = mgen[S] + 1; mheld[S] = 0; mrel[S] = 0 };
		g = mgen[S];
		take(S, g, res);
	} unless { killed[_pid] };
	done++
}

active proctype killer() {
	if
	:: killed[3] = 1
	:: killed[4] = 1
	:: killed[5] = 1
	:: killed[6] = 1
	:: skip
	fi
}

init {
	LOCALS; byte g;
	mgen[1] = 1; mgen[2] = 1;
	atomic {
		run worker(1, 2);	/* pid 3 */
		run worker(1, 1);	/* pid 4: a second thread of the same socket */
		run worker(2, 2);	/* pid 5 */
		run closer(1);		/* pid 6 */
	}
	/* everyone finished or killed */
	assert(_pid == 2);
	(done == 4);
	/* a reclaimer releases what is left (as the dead owners) */
	g = mgen[1]; release(1, g);
	g = mgen[2]; release(2, g);
	/* and one more change of the tally reflects whatever tag is left */
	atomic { wc = cnt; wt = ttag; wd = tdir; wg = tgen; wst = tst };
	if :: wt != 0 -> reflect(wc, wt, wd, wg) :: else -> skip fi;
	assert(cnt == 0)
}
