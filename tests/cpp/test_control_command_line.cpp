// gradswitchd's command line (command_line.h) over the option table of config.h: both places the
// DPDK options may go, flags, errors that name the option, and a --help that lists every option
// with its default.
#include <string>
#include <vector>

#include "harness.h"
#include "switch/options/command_line.h"
#include "switch/options/option_table.h"

using namespace gradswitch;

namespace {

bool parse(std::vector<std::string> args, CommandLine* cl, std::string* error) {
  *cl = CommandLine{};
  error->clear();
  return parse_command_line(args, cl, error);
}

}  // namespace

TEST(dpdk_options_before_and_after_the_eal_arguments) {
  CommandLine cl;
  std::string e;
  CHECK(parse({"--backend", "dpdk", "--threads", "2", "--agg-ip", "10.0.0.100", "--no-tap-config",
               "--notify=10.0.0.3:9911", "--", "-l", "0,1", "--no-huge", "--vdev=net_tap0"},
              &cl, &e));
  CHECK(cl.config.threads == 2 && cl.config.dpdk.agg_ip == "10.0.0.100" && !cl.config.dpdk.tap_config);
  CHECK(cl.config.dpdk.notify == "10.0.0.3:9911");
  CHECK((cl.eal_args == std::vector<std::string>{"-l", "0,1", "--no-huge", "--vdev=net_tap0"}));
  // The older form: DPDK options after a second `--`, parsed by the same table.
  CHECK(parse({"--backend", "dpdk", "--", "-l", "0", "--", "--agg-ip", "10.0.0.7", "--idle-sleep-us", "50",
               "--ring-size", "1024"},
              &cl, &e));
  CHECK(cl.config.dpdk.agg_ip == "10.0.0.7" && cl.config.dpdk.idle_sleep_us == 50 &&
        cl.config.dpdk.ring_size == 1024);
  CHECK((cl.eal_args == std::vector<std::string>{"-l", "0"}));
}

TEST(errors_name_the_option) {
  CommandLine cl;
  std::string e;
  CHECK(!parse({"--agg-ip", "10.0.0.1"}, &cl, &e) &&
        e.find("--agg-ip is an option of the DPDK backend") == 0);
  CHECK(!parse({"--backend", "dpdk", "--ring-size", "1000"}, &cl, &e) &&
        e.find("power of two") != std::string::npos);
  CHECK(!parse({"--backend", "dpdk", "--agg-mac", "02:00:00:00:00"}, &cl, &e) &&
        e.find("--agg-mac") != std::string::npos);
  CHECK(!parse({"--backend", "dpdk", "--notify", "10.0.0.1"}, &cl, &e) &&
        e.find("IPv4:PORT") != std::string::npos);
  CHECK(!parse({"--backend", "dpdk", "--no-tap-config=yes"}, &cl, &e) &&
        e.find("takes no value") != std::string::npos);
  CHECK(!parse({"--threads"}, &cl, &e) && e.find("needs a value") != std::string::npos);
  CHECK(!parse({"--thread", "2"}, &cl, &e) && e == "unknown option '--thread'");
  CHECK(!parse({"stray"}, &cl, &e) && e.find("unexpected argument 'stray'") == 0);
  CHECK(!parse({"--", "-l", "0"}, &cl, &e) && e.find("--backend dpdk") != std::string::npos);
  // After the EAL arguments only DPDK options are taken.
  CHECK(!parse({"--backend", "dpdk", "--", "-l", "0", "--", "--threads", "2"}, &cl, &e) &&
        e.find("only DPDK options") != std::string::npos);
  CHECK(!parse({"--backend", "dpdk", "--", "-l", "0", "--", "--layout", "io", "--", "x"}, &cl, &e));
  CHECK(parse({"--backend", "dpdk", "--layout", "8a", "--mac-age", "60"}, &cl, &e) &&
        cl.config.dpdk.layout == "8a");
}

TEST(help_lists_every_option_with_its_default) {
  const std::string h = help_text("gradswitchd", "EXTRA TEXT\n");
  for (const OptionSpec& o : switch_options()) {
    const std::string flag = std::string("--") + o.name;
    const size_t at = h.find("  " + flag + " ");
    CHECK(at != std::string::npos);
    if (at != std::string::npos) CHECK(h.find("(default ", at) < h.find('\n', at));
  }
  CHECK(h.find("DPDK backend options") != std::string::npos && h.find("EXTRA TEXT") != std::string::npos);
  CommandLine cl;
  std::string e;
  CHECK(parse({"--help"}, &cl, &e) && cl.help);
  CHECK(parse({"-V"}, &cl, &e) && cl.version);
}

GS_TEST_MAIN()
