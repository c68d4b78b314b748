// gradswitchd's TOML config file (config_file.h): every option of the table is a key by its own
// name (the DPDK ones in [dpdk]), each is parsed as its command-line flag is, the command line
// overrides the file, and every kind of bad input is an error naming the file, line and key.
#include <unistd.h>

#include <cstdio>
#include <string>
#include <vector>

#include "harness.h"
#include "switch/options/command_line.h"
#include "switch/options/config_file.h"
#include "switch/options/option_table.h"

using namespace gradswitch;

namespace {

// Every option's printed value, for comparing two configs option by option.
std::vector<std::string> values(const SwitchConfig& c) {
  std::vector<std::string> out;
  for (const OptionSpec& o : switch_options()) out.push_back(std::string(o.name) + "=" + o.get(c));
  return out;
}

bool apply(const std::string& text, SwitchConfig* c, std::string* e) {
  *c = SwitchConfig{};
  e->clear();
  return apply_config_text(text, "test.toml", c, e);
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// A temporary file holding `text`, removed when it goes.
struct TempFile {
  std::string path;
  explicit TempFile(const std::string& text) {
    char name[] = "/tmp/gs_config_XXXXXX";
    const int fd = mkstemp(name);
    path = name;
    if (fd >= 0) {
      if (write(fd, text.data(), text.size()) != static_cast<ssize_t>(text.size())) path.clear();
      close(fd);
    }
  }
  ~TempFile() { unlink(path.c_str()); }
};

// A value the option accepts that is not its default, as the command line would give it.
std::string other_value(const OptionSpec& o) {
  const SwitchConfig defaults;
  for (const char* v : {"2", "3", "64", "1024", "10.0.0.7", "10.0.0.7:9911", "02:00:00:00:00:07", "debug",
                        "json", "off", "on", "dpdk", "8a", "512M", "0.25", "/etc/gradswitch/x"}) {
    SwitchConfig c;
    std::string why;
    if (o.set(c, v, &why) && o.get(c) != o.get(defaults)) return v;
  }
  return "";
}

}  // namespace

TEST(every_option_of_the_table_is_a_key_parsed_as_its_flag_is) {
  // Generic over the table: an option added to config.h is covered without an edit here.
  for (const OptionSpec& o : switch_options()) {
    const std::string table = *o.group ? std::string("[") + o.group + "]\n" : "";
    std::string text, flag_value;
    if (!o.metavar) {
      text = table + o.name + " = true\n";
    } else {
      flag_value = other_value(o);
      CHECK(!flag_value.empty());  // the sample list above lacks a value this option accepts
      text = table + o.name + " = \"" + flag_value + "\"\n";
    }
    SwitchConfig from_file;
    std::string e;
    const bool ok = apply(text, &from_file, &e);
    if (!ok) std::fprintf(stderr, "  option %s: %s\n", o.name, e.c_str());
    CHECK(ok);
    SwitchConfig from_flag;
    std::string why;
    CHECK(o.set(from_flag, flag_value, &why));
    CHECK(values(from_file) == values(from_flag));
    CHECK(o.get(from_file) != o.get(SwitchConfig{}));
  }
}

TEST(toml_types_integers_floats_strings_booleans) {
  SwitchConfig c;
  std::string e;
  CHECK(
      apply("# a comment\nthreads = 4\ncontrol-port = 9000\ndata-port = 9001\nmax-memory = \"4G\"\n"
            "drop-rate = 0.01\nseed = 7\nlog-format = \"json\"\ninsecure = true\ncontrol-host = \"0.0.0.0\"\n"
            "backend = \"dpdk\"\n[dpdk]\nring-size = 1024\nno-tap-config = true\nagg-ip = \"10.0.0.9\"\n",
            &c, &e));
  CHECK(c.threads == 4 && c.control_port == 9000 && c.data_port == 9001 && c.max_memory == (4ull << 30));
  CHECK(c.drop_rate == 0.01 && c.seed == 7 && c.log_format == "json" && c.insecure);
  CHECK(c.control_host == "0.0.0.0" && c.backend == "dpdk" && c.dpdk.ring_size == 1024 && !c.dpdk.tap_config);
  CHECK(c.dpdk.agg_ip == "10.0.0.9");
  // A flag set to false is the flag not given; a dotted key is the same table.
  CHECK(apply("insecure = false\ndpdk.no-tap-config = false\ndpdk.mbufs = 2047\n", &c, &e));
  CHECK(!c.insecure && c.dpdk.tap_config && c.dpdk.mbufs == 2047);
  CHECK(apply("", &c, &e) && values(c) == values(SwitchConfig{}));
}

TEST(bad_input_names_the_file_line_and_key) {
  SwitchConfig c;
  std::string e;
  CHECK(!apply("threads = 2\nthread = 3\n", &c, &e) && e == "test.toml:2:1: unknown key 'thread'");
  CHECK(!apply("threads = 2\n\nslots = -4\n", &c, &e) &&
        e == "test.toml:3:9: key 'slots': expected an unsigned integer, got '-4'");
  CHECK(!apply("threads = 65\n", &c, &e) && contains(e, "test.toml:1:") && contains(e, "'threads'") &&
        contains(e, "out of range 1..64"));
  CHECK(!apply("log-level = \"loud\"\n", &c, &e) && contains(e, "test.toml:1:") &&
        contains(e, "'log-level'") && contains(e, "error|warn|info|debug"));
  CHECK(!apply("max-memory = \"4T\"\n", &c, &e) && contains(e, "'max-memory'"));
  CHECK(!apply("drop-rate = 1.5\n", &c, &e) && contains(e, "'drop-rate'") && contains(e, "between 0 and 1"));
  CHECK(!apply("insecure = \"yes\"\n", &c, &e) &&
        e == "test.toml:1:12: key 'insecure': expected true or false, got a string");
  CHECK(!apply("threads = true\n", &c, &e) && contains(e, "'threads'") && contains(e, "got a boolean"));
  CHECK(!apply("threads = [1, 2]\n", &c, &e) && contains(e, "got an array"));
  CHECK(!apply("threads = 2\nslots = [\n", &c, &e) && contains(e, "test.toml:2:") &&
        contains(e, "syntax error"));
  CHECK(!apply("threads = 2\nthreads = 3\n", &c, &e) && contains(e, "test.toml:2:") &&
        contains(e, "syntax error"));
  CHECK(!apply("threads 2\n", &c, &e) && contains(e, "test.toml:1:") && contains(e, "syntax error"));
  // The groups: a DPDK option at the top level, a top-level option in [dpdk], a table that is none.
  CHECK(!apply("agg-ip = \"10.0.0.1\"\n", &c, &e) &&
        e == "test.toml:1:1: unknown key 'agg-ip' (an option of the [dpdk] table)");
  CHECK(!apply("[dpdk]\nthreads = 2\n", &c, &e) && e == "test.toml:2:1: unknown key 'threads' in [dpdk] (a "
                                                        "top-level option: put it before the first table)");
  CHECK(!apply("[udp]\nbatch = 2\n", &c, &e) && e == "test.toml:1:2: unknown key 'udp' (no such table)");
  CHECK(!apply("dpdk = 3\n", &c, &e) && contains(e, "expected the table [dpdk]"));
  CHECK(!apply("[dpdk]\nring-size = 1000\n", &c, &e) && contains(e, "test.toml:2:") &&
        contains(e, "in [dpdk]") && contains(e, "power of two"));
  // The command line's own spellings are not keys.
  CHECK(!apply("--threads = 2\n", &c, &e) && e == "test.toml:1:1: unknown key '--threads'");
  CHECK(!apply("config = \"other.toml\"\n", &c, &e) && contains(e, "unknown key 'config'"));
}

TEST(unreadable_files) {
  SwitchConfig c;
  std::string e;
  CHECK(!load_config_file("/nonexistent/gradswitchd.toml", &c, &e) &&
        e == "cannot read the config file /nonexistent/gradswitchd.toml: No such file or directory");
  CHECK(!load_config_file("/tmp", &c, &e) && e == "cannot read the config file /tmp: not a regular file");
  TempFile f("threads = 3\nslots = 0\n");
  CHECK(!load_config_file(f.path, &c, &e) && e.find(f.path + ":2:9: key 'slots'") == 0);
}

TEST(the_command_line_overrides_the_file_wherever_config_stands) {
  TempFile f("threads = 3\nslots = 128\nlog-level = \"debug\"\n");
  for (bool config_first : {true, false}) {
    CommandLine cl;
    std::string e;
    std::vector<std::string> args = {"--slots", "64"};
    args.insert(config_first ? args.begin() : args.end(), {"--config", f.path});
    CHECK(parse_command_line(args, &cl, &e));
    CHECK(cl.config.threads == 3 && cl.config.slots == 64 && cl.config.log_level == "debug");
    CHECK(cl.config_file == f.path);
  }
  CommandLine cl;
  std::string e;
  CHECK(parse_command_line({"--config=" + f.path}, &cl, &e) && cl.config.slots == 128);
  // Checks across options see the file and the flags together.
  TempFile open("control-host = \"0.0.0.0\"\n");
  cl = CommandLine{};
  CHECK(!parse_command_line({"--config", open.path}, &cl, &e) && contains(e, "--auth-file"));
  cl = CommandLine{};
  CHECK(parse_command_line({"--config", open.path, "--insecure"}, &cl, &e));
  cl = CommandLine{};
  CHECK(!parse_command_line({"--config", f.path, "--config", f.path}, &cl, &e) && contains(e, "twice"));
  cl = CommandLine{};
  CHECK(!parse_command_line({"--config"}, &cl, &e) && contains(e, "needs a value"));
  cl = CommandLine{};
  CHECK(!parse_command_line({"--config", "/nonexistent.toml", "--threads", "2"}, &cl, &e) &&
        contains(e, "/nonexistent.toml"));
  // A file that selects the DPDK backend lets the command line carry EAL arguments.
  TempFile dpdk("backend = \"dpdk\"\n[dpdk]\nlayout = \"single\"\n");
  cl = CommandLine{};
  CHECK(parse_command_line({"--config", dpdk.path, "--", "-l", "0"}, &cl, &e) &&
        cl.config.dpdk.layout == "single");
  CHECK((cl.eal_args == std::vector<std::string>{"-l", "0"}));
}

GS_TEST_MAIN()
