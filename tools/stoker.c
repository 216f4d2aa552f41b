/*
 * stoker -- the command-line tool: this file only dispatches.
 *
 *   stoker bench PATH [options]   iterate a dataset and report throughput (tools/bench.c)
 *   stoker pack SRC OUT [options] write a dataset as .stk shards (tools/pack.c)
 *   stoker info PATH              what a dataset holds (tools/info.c)
 *   stoker verify PATH            check every sample's checksum (tools/info.c)
 *   stoker doctor PATH            which stage bounds throughput (tools/doctor.c)
 *   stoker options                the library's option table (tools/options.c)
 *   stoker version
 *
 * Every file under tools/ uses the public API (include/stoker.h) and libc
 * only; the pieces the subcommands share are in tools/cliutil.c.
 *
 * Exit status: 0 success, 1 a loader error (message on stderr), 2 bad usage.
 */
#include "stoker.h"

#include "commands.h"

#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    if (argc < 2) {
        stoker_usage(stderr);
        return 2;
    }
    if (!strcmp(argv[1], "bench"))
        return stoker_cmd_bench(argc, argv);
    if (!strcmp(argv[1], "pack"))
        return stoker_cmd_pack(argc, argv);
    if (!strcmp(argv[1], "info"))
        return stoker_cmd_info(argc, argv);
    if (!strcmp(argv[1], "verify"))
        return stoker_cmd_verify(argc, argv);
    if (!strcmp(argv[1], "doctor"))
        return stoker_cmd_doctor(argc, argv);
    if (!strcmp(argv[1], "options"))
        return stoker_cmd_options(argc, argv);
    if (!strcmp(argv[1], "version") || !strcmp(argv[1], "--version")) {
        printf("stoker %s\n", stk_version());
        return 0;
    }
    if (!strcmp(argv[1], "-h") || !strcmp(argv[1], "--help") || !strcmp(argv[1], "help")) {
        stoker_usage(stdout);
        return 0;
    }
    fprintf(stderr, "stoker: unknown command '%s'\n", argv[1]);
    stoker_usage(stderr);
    return 2;
}
