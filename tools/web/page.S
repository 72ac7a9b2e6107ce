/* page.S - links tools/web/index.html into the bulkshim binary as bs_web_page .. bs_web_page_end. */
	.section .rodata
	.balign 16
	.globl	bs_web_page
	.hidden	bs_web_page
	.globl	bs_web_page_end
	.hidden	bs_web_page_end
bs_web_page:
	.incbin	"tools/web/index.html"
bs_web_page_end:
	.byte	0
	.section .note.GNU-stack,"",%progbits
