/* test_fleet.c - unit tests of fleet budgets in the shim: the keys, and the live limit at admission. */
#include "admit/admit.h"
#include "log.h"
#include "sys.h"

#include <errno.h>
#include <fcntl.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>
#include <cmocka.h>

#include "seg_fixture.h"

static struct cfg_compartment comps[1];

static int
setup(void **state)
{
	(void)state;
	memset(comps, 0, sizeof(comps));
	fixture_config("uf", comps, 1);
	snprintf(comps[0].name, sizeof(comps[0].name), "db");
	comps[0].max_connections = 5;
	comps[0].enforce = true;
	comps[0].reject_errno = ECONNREFUSED;
	comps[0].fleet_limit = 30;
	comps[0].fleet_floor = 1;
	return 0;
}

static void
lease(struct seg_comp *c, uint32_t share, int64_t ms_from_now)
{
	atomic_store(&c->fleet_share, share);
	atomic_store(&c->fleet_expiry_ms, (uint64_t)((int64_t)now_mono_ms() + ms_from_now));
}

static void
test_live_limit_is_share_while_leased_else_floor(void **state)
{
	struct seg_comp c;

	(void)state;
	memset(&c, 0, sizeof(c));
	atomic_store(&c.limit, 20);
	assert_int_equal(limit_conn(&c), 20);	/* not in a fleet */
	atomic_store(&c.fleet_limit, 100);
	atomic_store(&c.fleet_floor, 3);
	assert_int_equal(limit_conn(&c), 3);	/* no lease yet */
	lease(&c, 7, 10000);
	assert_int_equal(limit_conn(&c), 7);
	lease(&c, 70, 10000);
	assert_int_equal(limit_conn(&c), 20);	/* max_connections caps a share */
	lease(&c, 7, -1);
	assert_int_equal(limit_conn(&c), 3);	/* the lease has passed */
	atomic_store(&c.fleet_floor, 30);
	assert_int_equal(limit_conn(&c), 20);	/* and caps a floor */
}

/* Admission takes the live limit: the share, then the floor after expiry;
 * what is held past a lowered limit stays. */
static void
test_admission_follows_share_and_floor(void **state)
{
	struct seg *s = attach();
	struct seg_comp *c = seg_comp(s, 0);
	enum bs_reason why;
	int slots[5];

	(void)state;
	assert_int_equal(atomic_load(&c->fleet_limit), 30);
	assert_int_equal(atomic_load(&c->fleet_floor), 1);
	/* No lease: the floor. */
	slots[0] = permit_acquire(s, seg_comp(s, 0), 0, 1000, false, &why);
	assert_true(slots[0] >= 0);
	assert_int_equal(permit_acquire(s, seg_comp(s, 0), 0, 1001, false, &why), -EBUSY);
	assert_int_equal(why, REASON_FULL);
	/* A share of 3. */
	lease(c, 3, 5000);
	slots[1] = permit_acquire(s, seg_comp(s, 0), 0, 1002, false, &why);
	slots[2] = permit_acquire(s, seg_comp(s, 0), 0, 1003, false, &why);
	assert_true(slots[1] >= 0 && slots[2] >= 0);
	assert_int_equal(permit_acquire(s, seg_comp(s, 0), 0, 1004, false, &why), -EBUSY);
	/* The lease passes: three held, nothing more until below the floor. */
	lease(c, 3, -1);
	assert_int_equal(atomic_load(&c->in_use), 3);
	slot_drop(s, (uint32_t)slots[2]);
	assert_int_equal(permit_acquire(s, seg_comp(s, 0), 0, 1005, false, &why), -EBUSY);
	slot_drop(s, (uint32_t)slots[1]);
	slot_drop(s, (uint32_t)slots[0]);
	slots[3] = permit_acquire(s, seg_comp(s, 0), 0, 1006, false, &why);
	assert_true(slots[3] >= 0);
	slot_drop(s, (uint32_t)slots[3]);
	seg_close(s);
}

/* A reload writes the fleet keys and leaves the agent's share and lease. */
static void
test_reload_keeps_the_lease(void **state)
{
	struct seg *s = attach();
	struct seg_comp *c = seg_comp(s, 0);

	(void)state;
	lease(c, 4, 5000);
	comps[0].fleet_floor = 2;
	comps[0].fleet_limit = 40;
	seg_apply_limits(c, &comps[0]);
	assert_int_equal(atomic_load(&c->fleet_floor), 2);
	assert_int_equal(atomic_load(&c->fleet_limit), 40);
	assert_int_equal(limit_conn(c), 4);
	seg_close(s);
}

static int
load_text(const char *text, struct bs_config *out)
{
	char p[64];
	int fd, rc;

	snprintf(p, sizeof(p), "/tmp/bulkshim-fleet-XXXXXX.cfg");
	fd = mkstemps(p, 4);
	assert_true(fd >= 0);
	assert_int_equal(write(fd, text, strlen(text)), (ssize_t)strlen(text));
	close(fd);
	err[0] = '\0';
	rc = cfg_load(p, out, false, err, sizeof(err));
	unlink(p);
	return rc;
}

static void
test_fleet_keys_and_their_defaults(void **state)
{
	struct bs_config c;
	char host[BS_HOST_MAX] = "";

	(void)state;
	assert_int_equal(load_text("fleet = { redis = \"unix:/run/redis.sock\"; name = \"shop\"; "
	    "lease_ms = 1200; };\ncompartments = ( { name = \"pg\"; destinations = [ "
	    "\"10.0.0.1:5432\" ]; max_connections = 40; fleet_limit = 500; fleet_floor = 4; } );\n",
	    &c), 0);
	assert_true(c.fleet.on);
	assert_string_equal(c.fleet.redis, "unix:/run/redis.sock");
	assert_string_equal(c.fleet.name, "shop");
	assert_int_equal(c.fleet.lease_ms, 1200);
	assert_int_equal(c.fleet.interval_ms, 200);
	assert_int_equal(c.fleet.timeout_ms, 200);
	assert_int_equal(c.fleet.max_hosts, 0);
	/* The host's name in the fleet: the machine's and the segment's. */
	gethostname(host, sizeof(host) / 2);
	strcat(host, "/");
	strcat(host, c.segment);
	assert_string_equal(c.fleet.host, host);
	/* Keepalive's default time to give up on a dead peer. */
	assert_int_equal(c.fleet.forget_s, 7875);
	assert_int_equal(c.comp[0].fleet_limit, 500);
	assert_int_equal(c.comp[0].fleet_floor, 4);
	cfg_free(&c);
	/* A name given is kept as it is; forget_s is at least two leases. */
	assert_int_equal(load_text("fleet = { redis = \"h:1\"; name = \"f\"; host = \"web1\"; "
	    "forget_s = 60; };\ncompartments = ( { name = \"pg\"; destinations = [ "
	    "\"10.0.0.1:5432\" ]; max_connections = 4; fleet_limit = 10; } );\n", &c), 0);
	assert_string_equal(c.fleet.host, "web1");
	assert_int_equal(c.fleet.forget_s, 60);
	cfg_free(&c);
	assert_int_equal(load_text("fleet = { redis = \"h:1\"; name = \"f\"; lease_ms = 3000; "
	    "forget_s = 5; };\ncompartments = ( { name = \"pg\"; destinations = [ "
	    "\"10.0.0.1:5432\" ]; max_connections = 4; fleet_limit = 10; } );\n", &c), -EINVAL);
	assert_non_null(strstr(err, "less than two leases"));
	/* fleet_limit needs max_connections, this host's ceiling. */
	assert_int_equal(load_text("fleet = { redis = \"h:1\"; name = \"f\"; };\ncompartments = ( "
	    "{ name = \"pg\"; destinations = [ \"10.0.0.1:5432\" ]; max_inflight = 4; "
	    "fleet_limit = 500; } );\n", &c), -EINVAL);
	assert_non_null(strstr(err, "needs max_connections"));
	/* A bare IPv6 address has no clear port. */
	assert_int_equal(load_text("fleet = { redis = \"::1:6379\"; name = \"f\"; };\ncompartments = ("
	    " { name = \"pg\"; destinations = [ \"10.0.0.1:5432\" ]; max_connections = 4; "
	    "fleet_limit = 500; } );\n", &c), -EINVAL);
	assert_non_null(strstr(err, "[v6]:port"));
	assert_int_equal(load_text("fleet = { redis = \"[::1]:6379\"; name = \"f\"; hosts = 3; };\n"
	    "compartments = ( { name = \"pg\"; destinations = [ \"10.0.0.1:5432\" ]; "
	    "max_connections = 4; fleet_limit = 500; } );\n", &c), 0);
	assert_int_equal(c.fleet.max_hosts, 3);
	cfg_free(&c);
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test(test_live_limit_is_share_while_leased_else_floor),
		cmocka_unit_test_setup_teardown(test_admission_follows_share_and_floor, setup, teardown),
		cmocka_unit_test_setup_teardown(test_reload_keeps_the_lease, setup, teardown),
		cmocka_unit_test(test_fleet_keys_and_their_defaults),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
