/* test_seg_access.c - unit tests of who may use a segment, and of what the fleet agent does about its segment. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <cmocka.h>

#include "../../tools/seg_access.c"
#include "../../tools/fleet_seg.c"

/* cli_common.c is not linked: status's check reads the config the target names. */
const char *
cli_config_path(const struct cli_target *t)
{
	return t != NULL && t->config != NULL ? t->config : BS_DEFAULT_CONFIG;
}

/* Ids that no user database names, so that messages show numbers. */
#define AGENT	5000001u
#define SERVICE	5000002u
#define AGENT_G	5000011u
#define SVC_G	5000012u

static struct bs_config cfg;
static gid_t agent_gids[2], svc_gids[2];
static struct seg_user agent, service, rootu;
static char msg[BS_ERRLEN];

static int
setup(void **state)
{
	(void)state;
	memset(&cfg, 0, sizeof(cfg));
	snprintf(cfg.segment, sizeof(cfg.segment), "shop");
	cfg.mode = 0600;
	agent_gids[0] = AGENT_G;
	agent = (struct seg_user){ .uid = AGENT, .ngids = 1, .gids = agent_gids, .name = "uid 5000001" };
	svc_gids[0] = SVC_G;
	service = (struct seg_user){ .uid = SERVICE, .ngids = 1, .gids = svc_gids,
	    .name = "uid 5000002" };
	rootu = (struct seg_user){ .uid = 0, .ngids = 1, .gids = agent_gids, .dac_override = true,
	    .chown = true, .name = "root" };
	msg[0] = '\0';
	return 0;
}

static void
own(uid_t uid, gid_t gid, unsigned mode)
{
	cfg.has_owner = true;
	cfg.owner = uid;
	cfg.has_group = gid != (gid_t)-1;
	cfg.group = gid;
	cfg.mode = mode;
}

static void
test_the_kernels_classes_and_seg_attachs_trust(void **state)
{
	struct seg_perm p = { SERVICE, SVC_G, 0600 };

	(void)state;
	assert_int_equal(seg_refusal_of(&p, &service, &cfg), SEG_USABLE);
	/* Another user's segment is not trusted, whatever its mode... */
	p.mode = 0666;
	assert_int_equal(seg_refusal_of(&p, &agent, &cfg), SEG_UNTRUSTED);
	assert_int_equal(seg_refusal_of(&p, &rootu, &cfg), SEG_UNTRUSTED);
	/* ... unless the config names its owner. */
	own(SERVICE, (gid_t)-1, 0600);
	assert_int_equal(seg_refusal_of(&p, &agent, &cfg), SEG_USABLE);
	p.mode = 0660;
	assert_int_equal(seg_refusal_of(&p, &agent, &cfg), SEG_UNWRITABLE);
	agent_gids[agent.ngids++] = SVC_G;
	assert_int_equal(seg_refusal_of(&p, &agent, &cfg), SEG_USABLE);
	/* Read alone is not enough: attaching maps it read-write. */
	p.mode = 0640;
	assert_int_equal(seg_refusal_of(&p, &agent, &cfg), SEG_UNWRITABLE);
	/* The owner's bits apply to the owner even when the others' allow more. */
	p.mode = 0066;
	assert_false(seg_user_can_open(&p, &service));
	assert_true(seg_user_can_open(&p, &agent));
	/* Root's segment is trusted by all, and opened by root alone at 0600. */
	p = (struct seg_perm){ 0, 0, 0600 };
	assert_int_equal(seg_refusal_of(&p, &service, &cfg), SEG_UNWRITABLE);
	assert_int_equal(seg_refusal_of(&p, &rootu, &cfg), SEG_USABLE);
}

static void
test_the_agent_waits_when_the_config_names_no_owner(void **state)
{
	(void)state;
	assert_int_equal(fleet_seg_plan(&cfg, NULL, &rootu, NULL, msg, sizeof(msg)), FSEG_WAIT);
	assert_non_null(strstr(msg, "/dev/shm/bulkshim.shop"));
	assert_non_null(strstr(msg, "names no owner"));
}

static void
test_the_agent_creates_for_the_owner_when_it_can_give_it_away(void **state)
{
	(void)state;
	own(SERVICE, AGENT_G, 0660);
	/* Without CAP_CHOWN it cannot: it waits for the service. */
	assert_int_equal(fleet_seg_plan(&cfg, NULL, &agent, &service, msg, sizeof(msg)), FSEG_WAIT);
	assert_non_null(strstr(msg, "cannot give it to uid 5000002 without CAP_CHOWN"));
	agent.chown = true;
	/* The service outside the agent's group could not give a segment it makes to it. */
	assert_int_equal(fleet_seg_plan(&cfg, NULL, &agent, &service, msg, sizeof(msg)), FSEG_CREATE);
	assert_non_null(strstr(msg, "warning: "));
	assert_non_null(strstr(msg, "as uid 5000002:gid 5000012, mode 0660"));
	svc_gids[service.ngids++] = AGENT_G;
	assert_int_equal(fleet_seg_plan(&cfg, NULL, &agent, &service, msg, sizeof(msg)), FSEG_CREATE);
	assert_string_equal(msg, "");
	/* Root creates for anyone, and opens anything again. */
	own(SERVICE, (gid_t)-1, 0600);
	assert_int_equal(fleet_seg_plan(&cfg, NULL, &rootu, &service, msg, sizeof(msg)), FSEG_CREATE);
	assert_string_equal(msg, "");
}

static void
test_the_agent_refuses_to_create_what_it_or_the_owner_could_not_use(void **state)
{
	(void)state;
	agent.chown = true;
	/* 0600 for the service: the agent could not open it after a restart. */
	own(SERVICE, (gid_t)-1, 0600);
	assert_int_equal(fleet_seg_plan(&cfg, NULL, &agent, &service, msg, sizeof(msg)), FSEG_REFUSE);
	assert_non_null(strstr(msg, "could not open again"));
	assert_non_null(strstr(msg, "group = 5000011; mode = \"0660\";"));
	/* A mode that keeps the owner out. */
	own(SERVICE, AGENT_G, 0060);
	assert_int_equal(fleet_seg_plan(&cfg, NULL, &agent, &service, msg, sizeof(msg)), FSEG_REFUSE);
	assert_non_null(strstr(msg, "mode 0060 would not let uid 5000002"));
}

static void
test_the_agent_refuses_a_segment_the_owner_cannot_use(void **state)
{
	struct seg_perm p = { 0, 0, 0600 };

	(void)state;
	own(SERVICE, AGENT_G, 0660);
	assert_int_equal(fleet_seg_plan(&cfg, &p, &rootu, &service, msg, sizeof(msg)), FSEG_REFUSE);
	assert_non_null(strstr(msg, "root:root, mode 0600"));
	assert_non_null(strstr(msg, "cannot write it"));
	assert_non_null(strstr(msg, "`bulkshim rm shop`"));
	/* A third user's segment is one the service does not trust. */
	p = (struct seg_perm){ AGENT, AGENT_G, 0666 };
	assert_int_equal(fleet_seg_plan(&cfg, &p, &agent, &service, msg, sizeof(msg)), FSEG_REFUSE);
	assert_non_null(strstr(msg, "does not trust it"));
}

static void
test_the_agent_names_the_fix_when_it_cannot_use_the_segment(void **state)
{
	struct seg_perm p = { SERVICE, SVC_G, 0600 };

	(void)state;
	/* No owner in the config: root may write it but does not trust it. */
	assert_int_equal(fleet_seg_plan(&cfg, &p, &rootu, NULL, msg, sizeof(msg)), FSEG_REFUSE);
	assert_non_null(strstr(msg, "add owner = 5000002; to the config"));
	assert_null(strstr(msg, "bulkshim rm"));
	/* The agent could not write it either: the group and mode too, and a new segment. */
	assert_int_equal(fleet_seg_plan(&cfg, &p, &agent, NULL, msg, sizeof(msg)), FSEG_REFUSE);
	assert_non_null(strstr(msg, "owner = 5000002; group = 5000011; mode = \"0660\";"));
	assert_non_null(strstr(msg, "`bulkshim rm shop`"));
	/* Trusted but not writable: its creator could not give it to the config's group. */
	own(SERVICE, AGENT_G, 0660);
	p.mode = 0660;
	assert_int_equal(fleet_seg_plan(&cfg, &p, &agent, &service, msg, sizeof(msg)), FSEG_REFUSE);
	assert_non_null(strstr(msg, "could not give it to group gid 5000011"));
	assert_non_null(strstr(msg, "(adduser uid 5000002 gid 5000011)"));
	/* Given to the group: attach. */
	p.gid = AGENT_G;
	assert_int_equal(fleet_seg_plan(&cfg, &p, &agent, &service, msg, sizeof(msg)), FSEG_ATTACH);
	assert_string_equal(msg, "");
}

static void
test_perm_text_and_config_values(void **state)
{
	struct seg_perm p = { 0, 0, 0640 };
	char buf[160];

	(void)state;
	assert_string_equal(seg_perm_text(&p, buf, sizeof(buf)), "root:root, mode 0640");
	p = (struct seg_perm){ SERVICE, SVC_G, 0600 };
	assert_string_equal(seg_perm_text(&p, buf, sizeof(buf)), "uid 5000002:gid 5000012, mode 0600");
	config_value(0, false, buf, sizeof(buf));
	assert_string_equal(buf, "\"root\"");
	config_value(SERVICE, false, buf, sizeof(buf));
	assert_string_equal(buf, "5000002");
}

int
main(void)
{
	const struct CMUnitTest tests[] = {
		cmocka_unit_test_setup(test_the_kernels_classes_and_seg_attachs_trust, setup),
		cmocka_unit_test_setup(test_the_agent_waits_when_the_config_names_no_owner, setup),
		cmocka_unit_test_setup(test_the_agent_creates_for_the_owner_when_it_can_give_it_away,
		    setup),
		cmocka_unit_test_setup(test_the_agent_refuses_to_create_what_it_or_the_owner_could_not_use,
		    setup),
		cmocka_unit_test_setup(test_the_agent_refuses_a_segment_the_owner_cannot_use, setup),
		cmocka_unit_test_setup(test_the_agent_names_the_fix_when_it_cannot_use_the_segment, setup),
		cmocka_unit_test_setup(test_perm_text_and_config_values, setup),
	};

	return cmocka_run_group_tests(tests, NULL, NULL);
}
