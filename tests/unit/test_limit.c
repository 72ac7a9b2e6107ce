/* test_limit.c - unit tests of limit_why: the limit admission holds a take to, and the level it comes from. */
#include "admit/admit.h"
#include "log.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>
#include <cmocka.h>

/* Sets c's adaptive limit for permit kind p to lim, on. */
static void
adaptive(struct seg_comp *c, int p, uint32_t lim)
{
	struct ad_state st;

	memset(&st, 0, sizeof(st));
	st.limit16 = lim * 16;
	atomic_store(&c->ad.kind, (uint32_t)p);
	atomic_store(&c->ad.ctl, ad_pack(&st));
	atomic_store(&c->ad.mode, AD_ON);
}

/* limit_why's limit and level for kind p, checked against limit_now's. */
static uint32_t
why(struct seg_comp *c, int p, enum limit_by *by)
{
	uint32_t v = limit_why(c, p, by);

	assert_int_equal(v, limit_now(p == P_INFLIGHT ? &c->inflight_limit : &c->limit, p));
	return v;
}

static void
test_static_and_none(void **state)
{
	struct seg_comp c;
	enum limit_by by;

	(void)state;
	memset(&c, 0, sizeof(c));
	atomic_store(&c.limit, 64);
	atomic_store(&c.inflight_limit, UINT32_MAX);
	assert_int_equal(why(&c, P_CONN, &by), 64);
	assert_int_equal(by, LIMIT_BY_STATIC);
	assert_int_equal(why(&c, P_INFLIGHT, &by), UINT32_MAX);
	assert_int_equal(by, LIMIT_BY_NONE);
	assert_string_equal(limit_by_name(LIMIT_BY_NONE), "none");
	assert_string_equal(limit_by_name(LIMIT_BY_MAX), "?");
}

static void
test_fleet_share_then_floor(void **state)
{
	struct seg_comp c;
	enum limit_by by;

	(void)state;
	memset(&c, 0, sizeof(c));
	atomic_store(&c.limit, 8);
	atomic_store(&c.fleet_limit, 20);
	atomic_store(&c.fleet_floor, 1);
	/* No lease: the floor binds. */
	assert_int_equal(why(&c, P_CONN, &by), 1);
	assert_int_equal(by, LIMIT_BY_FLEET_FLOOR);
	assert_string_equal(limit_by_name(by), "fleet floor");
	atomic_store(&c.fleet_share, 5);
	atomic_store(&c.fleet_expiry_ms, now_mono_ms() + 60000);
	assert_int_equal(why(&c, P_CONN, &by), 5);
	assert_int_equal(by, LIMIT_BY_FLEET_SHARE);
	/* A share above max_connections: the static limit binds (a tie too). */
	atomic_store(&c.fleet_share, 8);
	assert_int_equal(why(&c, P_CONN, &by), 8);
	assert_int_equal(by, LIMIT_BY_STATIC);
}

static void
test_adaptive_below_each_level(void **state)
{
	struct seg_comp c;
	enum limit_by by;

	(void)state;
	memset(&c, 0, sizeof(c));
	atomic_store(&c.limit, 64);
	atomic_store(&c.inflight_limit, 32);
	adaptive(&c, P_CONN, 6);
	assert_int_equal(why(&c, P_CONN, &by), 6);
	assert_int_equal(by, LIMIT_BY_ADAPTIVE);
	/* The adaptive limit of connections leaves requests in flight alone. */
	assert_int_equal(why(&c, P_INFLIGHT, &by), 32);
	assert_int_equal(by, LIMIT_BY_STATIC);
	/* A fleet floor below it binds instead. */
	atomic_store(&c.fleet_limit, 20);
	atomic_store(&c.fleet_floor, 2);
	assert_int_equal(why(&c, P_CONN, &by), 2);
	assert_int_equal(by, LIMIT_BY_FLEET_FLOOR);
	adaptive(&c, P_INFLIGHT, 4);
	assert_int_equal(why(&c, P_INFLIGHT, &by), 4);
	assert_int_equal(by, LIMIT_BY_ADAPTIVE);
	/* Off: pinned into the static word, the adaptive limit binds nothing. */
	atomic_store(&c.ad.mode, AD_OFF);
	assert_int_equal(why(&c, P_INFLIGHT, &by), 32);
	assert_int_equal(by, LIMIT_BY_STATIC);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_static_and_none),
		cmocka_unit_test(test_fleet_share_then_floor),
		cmocka_unit_test(test_adaptive_below_each_level),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
