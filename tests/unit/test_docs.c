/*
 * The docs hold together: every relative link in README.md and docs/
 * reaches a file, and every #fragment a heading (the README was split
 * into docs/, and links are what a reader follows).
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <sys/wait.h>

Test(docs, every_relative_link_resolves)
{
    int status = system("bash scripts/check-doc-links.sh");
    cr_assert(WIFEXITED(status) && WEXITSTATUS(status) == 0,
              "scripts/check-doc-links.sh found broken links (above)");
}
