/*
 * api.c -- the library-wide entry points that belong to no stage: the names
 * and texts of the return codes, and the version.
 *
 * Both tables of the return codes are expanded from STK_CODE_MAP in the
 * public header, so a code has its name and its text in one place; the
 * static assertions below keep that list's numbers equal to the STK_* defines
 * whose numbers never change.
 */
#include "internal.h"

#define STK__CHECK_CODE(name, num, text)                                                           \
    _Static_assert(STK_##name == (num), "STK_CODE_MAP: STK_" #name " has another number");
STK_CODE_MAP(STK__CHECK_CODE)
#undef STK__CHECK_CODE

const char *stk_strerror(int code)
{
    switch (code) {
#define STK__TEXT(name, num, text)                                                                 \
    case (num): return text;
        STK_CODE_MAP(STK__TEXT)
#undef STK__TEXT
    default: return "unknown error";
    }
}

const char *stk_errname(int code)
{
    switch (code) {
#define STK__NAME(name, num, text)                                                                 \
    case (num): return "STK_" #name;
        STK_CODE_MAP(STK__NAME)
#undef STK__NAME
    default: return NULL;
    }
}

const char *stk_version(void)
{
    return STK_VERSION_STRING;
}
