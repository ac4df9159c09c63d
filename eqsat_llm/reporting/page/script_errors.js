// first in <head>: any later script error lands on <html data-script-errors> (tests read it)
(function(){var el=document.documentElement,seen=[];
function note(msg){seen.push(String(msg));el.dataset.scriptErrors=String(seen.length);
el.dataset.scriptErrorMessages=seen.join(' | ');}
window.addEventListener('error',function(e){note(e.message||e);});
window.addEventListener('unhandledrejection',function(e){note(e.reason);});})();
